"""The Slurm job a process runs in, read from the environment, and what follows from it.

Slurm describes a job through ``SLURM_*`` variables. Every launcher this guide uses (srun,
mpirun, horovodrun, torchrun) needs some of them translated: the node list expanded, the
first node chosen as rendezvous host, the port derived from the job id (checked where it
is used: ``runtime.rendezvous``). That translation lives here, once; the launchers
(``runtime.launchers``) receive it as one scheduler among others (``runtime.schedulers``).

>>> job = SlurmJob.from_env({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[01-02]",
...                          "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4"})
>>> job.nodes
['gpu01', 'gpu02']
>>> job.rendezvous()
('gpu01', 24242)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError

from .rendezvous import PORT_BASE, PORT_SPAN, checked_port, derived_port  # noqa: F401 - PORT_*: the scheme's range
from .variables import read_int  # noqa: F401 - also read here by the per-task check (cluster.doctor.tasks)


def expand_per_node(value: str | None) -> list[int]:
    """Expand Slurm's compressed per-node counts: '4(x2),2' -> [4, 4, 2]."""
    if not value:
        return []
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise GuideError(f"cannot read the per-node count {value!r} (expected e.g. '4(x2),2')")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _gpus_per_node(env: Mapping[str, str]) -> int | None:
    """GPUs per node from whichever request syntax the job used.

    ``--gpus-per-node=4``, ``--gpus-per-node=a100:4`` and ``--gres=gpu:v100:4`` all end in
    the count; a bare ``--gres=gpu`` means one. Where Slurm exports none of those (22.05
    with ``--gres`` or ``--gpus-per-task``), the GPUs it gave this node.

    >>> _gpus_per_node({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_TASK": "1"})
    4
    """
    for name in ("SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS_PER_NODE"):
        value = env.get(name)
        if value:
            return int(value.rsplit(":", 1)[-1].split("(")[0])
    gres = env.get("SLURM_JOB_GRES") or env.get("SLURM_GRES") or ""
    for item in gres.split(","):
        fields = re.sub(r"\(.*?\)", "", item).split(":")  # drop "(IDX:0-3)" annotations
        if fields[0] == "gpu":
            return int(fields[-1]) if fields[-1].isdigit() else 1
    on_node = env.get("SLURM_GPUS_ON_NODE", "")
    return int(on_node) if on_node.isdigit() and int(on_node) > 0 else None


@dataclass(frozen=True)
class SlurmJob:
    """A Slurm job as one of its tasks sees it."""

    job_id: int
    nodes: list[str]
    ntasks: int
    tasks_per_node: list[int] = field(default_factory=list)
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    procid: int | None = None
    localid: int | None = None
    nodeid: int | None = None
    array_task_id: int | None = None
    # Set only inside an srun step: the batch script itself has SLURM_PROCID=0 too, so
    # SLURM_PROCID alone is no proof that srun started this process.
    step_id: int | None = None
    step_ntasks: int | None = None
    step_nodes: list[str] = field(default_factory=list)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "SlurmJob | None":
        """Read the job from ``env`` (default ``os.environ``); ``None`` outside a job."""
        env = os.environ if env is None else env
        job_id = read_int(env, "SLURM_JOB_ID")
        if job_id is None:
            return None
        # Imported here, in a job: a run outside Slurm (a workstation, a lent GPU) needs no
        # node-list parser, and the engine imports this module through the launchers.
        import hostlist

        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        nodes = hostlist.expand_hostlist(nodelist) if nodelist else []
        per_node = expand_per_node(env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE"))
        if len(per_node) == 1 and len(nodes) > 1:
            per_node = per_node * len(nodes)  # --ntasks-per-node gives one number for all nodes
        ntasks = read_int(env, "SLURM_NTASKS") or read_int(env, "SLURM_NPROCS") or sum(per_node) or 1
        return cls(
            job_id=job_id,
            nodes=nodes,
            ntasks=ntasks,
            tasks_per_node=per_node,
            cpus_per_task=read_int(env, "SLURM_CPUS_PER_TASK"),
            gpus_per_node=_gpus_per_node(env),
            procid=read_int(env, "SLURM_PROCID"),
            localid=read_int(env, "SLURM_LOCALID"),
            nodeid=read_int(env, "SLURM_NODEID"),
            array_task_id=read_int(env, "SLURM_ARRAY_TASK_ID"),
            step_id=read_int(env, "SLURM_STEP_ID"),
            step_ntasks=read_int(env, "SLURM_STEP_NUM_TASKS"),
            step_nodes=hostlist.expand_hostlist(env["SLURM_STEP_NODELIST"]) if env.get("SLURM_STEP_NODELIST") else [],
        )

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def in_step(self) -> bool:
        """Whether this process is a task of an srun step (not the batch script itself)."""
        return self.step_id is not None

    @property
    def master_addr(self) -> str:
        """The first node of the allocation: every task agrees on it without talking."""
        if not self.nodes:
            raise GuideError("SLURM_JOB_NODELIST is empty; cannot choose a rendezvous host")
        return self.nodes[0]

    @property
    def master_port(self) -> int:
        """The port derived from the job id, so that two jobs sharing a node rarely collide;
        unchecked (``runtime.rendezvous`` checks it where the server will listen)."""
        return derived_port(self.job_id)

    def rendezvous(self) -> tuple[str, int]:
        return self.master_addr, self.master_port


# What Slurm's clients need to find the cluster: kept when submitting from inside a job.
SUBMIT_KEEP = ("SLURM_CONF",)


def submission_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to submit a job with (sbatch, salloc) from this process.

    Inside a job (a notebook's kernel that the hub started as a job, an ``salloc`` shell,
    a batch script), the environment holds the outer job's ``SLURM_*`` variables. With
    ``--export=ALL`` (Slurm's default) they reach the new job, where Slurm overwrites only
    those the new job sets itself: the rest describe the wrong job, and srun reads some of
    them as options (the outer job's ``SLURM_MEM_PER_CPU`` beside the new job's
    ``SLURM_MEM_PER_NODE``: "mutually exclusive", and the step is refused). So inside a
    job every ``SLURM_*`` variable is dropped except ``SLURM_CONF`` (where the cluster's
    configuration is); ``SBATCH_*`` and ``SRUN_*`` (a user's own defaults) stay. Outside a
    job nothing changes. ``slurm_examples/submit.sh`` applies the same rule.

    >>> sorted(submission_env({"SLURM_JOB_ID": "7", "SLURM_MEM_PER_CPU": "100", "SLURM_CONF": "/etc/slurm.conf",
    ...                        "SBATCH_ACCOUNT": "p1", "HOME": "/home/me"}))
    ['HOME', 'SBATCH_ACCOUNT', 'SLURM_CONF']
    >>> submission_env({"SLURM_MEM_PER_CPU": "100"})  # not inside a job: as it is
    {'SLURM_MEM_PER_CPU': '100'}
    """
    env = dict(os.environ if env is None else env)
    if not env.get("SLURM_JOB_ID"):
        return env
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k in SUBMIT_KEEP}


def without_outer_job(command: list[str], env: Mapping[str, str] | None = None) -> list[str]:
    """``command`` prefixed with ``env -u NAME ...`` for each variable :func:`submission_env`
    drops: for launchers that submit with their own copy of this process's environment
    (ipyparallel's Slurm launcher), where the environment itself cannot be replaced.

    >>> without_outer_job(["sbatch"], {"SLURM_JOB_ID": "7", "SLURM_CONF": "/c", "SLURM_NTASKS": "1"})
    ['env', '-u', 'SLURM_JOB_ID', '-u', 'SLURM_NTASKS', 'sbatch']
    """
    env = os.environ if env is None else env
    dropped = sorted(set(env) - set(submission_env(env)))
    return ["env", *(a for name in dropped for a in ("-u", name)), *command] if dropped else list(command)


def on_first_node(job: SlurmJob, env: Mapping[str, str]) -> bool:
    """Whether this process runs on the job's first node (where the batch script runs and a
    rendezvous server listens). Slurm names the node in SLURMD_NODENAME; the host name is
    the fallback (several test nodes may share one host, so it is not the first choice)."""
    import socket

    here = env.get("SLURMD_NODENAME") or socket.gethostname()
    return bool(job.nodes) and job.nodes[0] in (here, here.split(".")[0])


@one_line_errors("python -m guide_utils rendezvous")
def rendezvous_main(argv: list[str] | None = None) -> int:
    """``python -m guide_utils rendezvous``: print ``HOST:PORT`` for this job's rendezvous.

    For launchers that need it on their command line (``torchrun --rdzv-endpoint``), run in
    the batch script, on the first node: the port derived from the job id if nothing holds
    it there, else a free one (``runtime.rendezvous``). The script hands the answer to every
    node, so they agree without talking.
    """
    ArgumentParser(prog="python -m guide_utils rendezvous",
                   description="Print HOST:PORT of this Slurm job's rendezvous: the first node, and the port "
                               "derived from the job id (20000 + id mod 10000), or a free one when something on "
                               "the first node holds it. Run it in the batch script; it takes no arguments."
                   ).parse_args(argv)
    job = SlurmJob.from_env()
    if job is None:
        raise GuideError("not inside a Slurm job (SLURM_JOB_ID is unset); run it in an sbatch script")
    host, port = job.rendezvous()
    if on_first_node(job, os.environ):  # elsewhere (a login node) the port cannot be checked
        port = checked_port(port)
    print(f"{host}:{port}")
    return 0
