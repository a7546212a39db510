"""The doctor: what this machine, its stack and a Slurm job look like, and what will hurt."""

# The command (cli) and its public face, what notebooks and tests call. The parts are a
# module each: the facts (facts, running the probes), the judgement (diagnosis, gpus), the
# report (report), the per-task check (tasks: ``task-probe``, ``doctor --tasks``) and the
# network between the nodes (network: HPE Slingshot found by the node, ``doctor --network``).
from .cli import PROG, main
from .diagnosis import EXPECTED, Diagnosis, diagnose, diagnose_job
from .facts import DEFAULT_LOADER_WORKERS, DISTS, FRAMEWORKS, Facts, Job, gather
from .report import render

__all__ = ["DEFAULT_LOADER_WORKERS", "DISTS", "EXPECTED", "FRAMEWORKS", "PROG", "Diagnosis", "Facts", "Job",
           "diagnose", "diagnose_job", "gather", "main", "render"]
