"""``python -m guide_utils doctor``: the first thing to run on a new machine or in a new job.

It reports the software stack (Python, PyTorch, torchvision, TensorFlow, Horovod and what
Horovod was built with), the MPI on the PATH, the GPUs, and, inside a Slurm job, the job's
shape; then it warns about each misconfiguration it can see. It exits non-zero only when
the stack cannot run the job at all, and says why. ``--tasks FILE`` judges instead what each
task of a job really got (``tasks``: the lines of ``task-probe``).

Which job: ``--framework pytorch|tensorflow`` and ``--dist none|ddp|horovod|mwms``. A DDP or
MultiWorkerMirroredStrategy job needs no Horovod, so a missing Horovod is a problem only for
``--dist horovod``; and only what the job uses is probed (a PyTorch job never imports
TensorFlow), which keeps the doctor at the top of every batch job quick. Without
``--dist`` it checks the whole guide: PyTorch with every kind of distribution, and
TensorFlow as far as it is there. ``--launch tasks`` (srun starts every rank: the sbatch
scripts' default) adds that Horovod must have its MPI controller: srun's MPI plugin is how its
ranks find each other.

The work is split so each part can be tested on its own: :func:`gather` reads the facts
(``facts``, running the ``probes``), :func:`diagnose` turns facts into warnings and problems
(``diagnosis``, a pure function), and :func:`render` prints them (``report``).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ...core.cli import ArgumentParser, one_line_errors
from ...core.config import PROFILES, make_config

from .diagnosis import diagnose
from .facts import DEFAULT_LOADER_WORKERS, DISTS, FRAMEWORKS, LAUNCHES, Job, gather
from .network import network_report
from .report import render
from .tasks import check as check_tasks

PROG = "python -m guide_utils doctor"


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG,
                            description="Report the software stack, GPUs and Slurm job, and warn about "
                                        "misconfigurations. Exit status 1 when the stack cannot run the job.")
    parser.add_argument("--framework", choices=FRAMEWORKS,
                        help="the job's framework (default: check the whole guide)")
    parser.add_argument("--dist", choices=sorted({*DISTS["pytorch"], *DISTS["tensorflow"]}),
                        help="the job's --dist; Horovod is needed only for horovod (default: the whole guide)")
    parser.add_argument("--launch", choices=LAUNCHES,
                        help="how the job starts its processes (lib/guide.sh's guide_setup): tasks = srun starts "
                             "each one (Horovod then needs its MPI controller), node = a launcher per node, "
                             "shell = a launcher in the batch shell")
    parser.add_argument("--loader-workers", type=int, default=None,
                        help=f"DataLoader workers per task you plan to use (default: the --profile's, "
                             f"{DEFAULT_LOADER_WORKERS} for full)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full",
                        help="training profile the job will run (sets the loader-worker default)")
    parser.add_argument("--quick", action="store_true",
                        help="check only the Slurm job, not the frameworks (each framework probe starts an "
                             "interpreter: seconds of CPU; for CI jobs on a stack checked once per run)")
    parser.add_argument("--json", action="store_true", help="print the facts and diagnosis as JSON")
    parser.add_argument("--tasks", metavar="FILE",
                        help="instead: judge the CPUs and GPUs of a job's tasks from their `python -m guide_utils "
                             "task-probe` lines in FILE (- for stdin); exit status 1 when a task lacks what the "
                             "job asked for")
    parser.add_argument("--network", action="store_true",
                        help="instead: start NCCL (RCCL) once on this node's GPU with NCCL_DEBUG=INFO and say which "
                             "network it uses between nodes; exit status 1 when it is TCP sockets where the node "
                             "(HPE Slingshot: /sys/class/cxi, hsn* interfaces) or the site's settings expect the "
                             "libfabric (OFI) plugin")
    args = parser.parse_args(argv)
    if args.tasks is not None:
        return check_tasks(args.tasks)
    if args.network:
        line, problems = network_report()
        print("\n".join([line, *(f"PROBLEM: {p}" for p in problems)]))
        return 1 if problems else 0
    if args.loader_workers is None:
        args.loader_workers = make_config(args.profile).loader_workers
        if args.loader_workers == "auto":  # what the engine picks on a GPU with this process's CPUs
            from ...runtime.cpus import default_loader_workers

            args.loader_workers = default_loader_workers("cuda")
    job = Job(args.framework or ("pytorch" if args.dist in ("ddp", "none") else
                                 "tensorflow" if args.dist == "mwms" else None), args.dist, quick=args.quick,
              launch=args.launch)
    facts = gather(loader_workers=args.loader_workers, job=job)
    diagnosis = diagnose(facts)
    if args.json:
        data = asdict(facts)
        data["slurm"] = asdict(facts.slurm) if facts.slurm else None
        print(json.dumps({"facts": data, "warnings": diagnosis.warnings, "problems": diagnosis.problems}, indent=2))
    else:
        print(render(facts, diagnosis))
    return 0 if diagnosis.usable else 1
