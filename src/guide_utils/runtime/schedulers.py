"""The batch scheduler a process runs under: Slurm, LSF or PBS, read from the environment.

A launcher (``runtime.launchers``) says who a process is among those it started; the
scheduler says which job they all belong to: its id and array index, its nodes, the
directory it was submitted from (which the nodes share: where the rendezvous port is
announced, ``runtime.rendezvous``) and, where it says so, the CPUs a task asked for. A
launcher asks the :class:`Scheduler` that :func:`detect` picks for these facts, so the same
launcher class (mpirun, torchrun) finds its job under any scheduler, and a launcher of one
scheduler (jsrun under LSF) overrides none of another's. A new scheduler is one subclass
here: its variables, and the facts it exports differently.

>>> job = detect({"PBS_JOBID": "4242[3].pbs01", "PBS_ARRAY_INDEX": "3", "PBS_O_WORKDIR": "/home/me/run"})
>>> job.name, job.job_id, job.array_index, job.submit_dir, job.rendezvous_key()
('pbs', 4242, 3, '/home/me/run', 'pbs4242.3')
>>> detect({"LSB_JOBID": "31337", "LSB_MCPU_HOSTS": "batch1 1 h41n04 42 h41n05 42"}).nodes
['batch1', 'h41n04', 'h41n05']
>>> detect({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_ID": "0"}).rendezvous_key()
'7.0.0'
>>> detect({}) is None
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Mapping

from .slurm import SlurmJob
from .variables import read_int

DEFAULT = "slurm"  # the scheduler this guide's examples use: named first outside any job


class Scheduler:
    """The job this process belongs to, as the scheduler's variables (``env``) describe it."""

    name: ClassVar[str] = ""  # lower case, a prefix of its announcement files: "pbs"
    label: ClassVar[str] = ""  # as its documentation writes it: "PBS"
    JOB_ID: ClassVar[tuple[str, ...]] = ()  # the variables of the job id (the first one set wins)
    ARRAY_INDEX: ClassVar[tuple[str, ...]] = ()  # of this job's index in a job array
    SUBMIT_DIR: ClassVar[tuple[str, ...]] = ()  # of the directory it was submitted from
    registry: ClassVar[list[type["Scheduler"]]] = []
    job: Any = None  # the scheduler's own full description, where there is one (Slurm: a SlurmJob)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            Scheduler.registry.append(cls)

    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        """Whether this scheduler started the job the process whose environment is ``env`` runs in."""
        return any(env.get(n, "").strip() for n in cls.JOB_ID)

    def __repr__(self) -> str:
        return f"<{self.label} job {self.job_id}>"

    @property
    def job_id(self) -> int | None:
        """The job's number (``1234`` of PBS's ``1234.server``)."""
        return read_int(self.env, *self.JOB_ID)

    @property
    def array_index(self) -> int | None:
        """This job's index in its job array; None outside an array."""
        return read_int(self.env, *self.ARRAY_INDEX)

    @property
    def submit_dir(self) -> str | None:
        """Where the job was submitted, a directory every node of it can read and write."""
        return next((self.env[n] for n in self.SUBMIT_DIR if self.env.get(n)), None)

    @property
    def nodes(self) -> list[str]:
        """The job's hosts, in the scheduler's order (empty when it does not say)."""
        return []

    @property
    def task_nodes(self) -> list[str]:
        """The hosts of the tasks this process is one of (Slurm: its step's), the first one
        where rank 0 runs unless the launcher says otherwise."""
        return self.nodes

    @property
    def tasks(self) -> int | None:
        """The job's tasks, where the scheduler counts them."""
        return None

    @property
    def node_index(self) -> int | None:
        """The index of this task's node among the job's nodes, where the scheduler says."""
        return None

    @property
    def cpus_per_task(self) -> int | None:
        """The CPUs the job asked for each task, where the scheduler says."""
        return None

    def rendezvous_key(self) -> str:
        """Names this run of the job: the rendezvous announcement's file name."""
        return f"{self.name}{self.job_id}.{self.array_index or 0}"


class Slurm(Scheduler):
    name, label = "slurm", "Slurm"
    JOB_ID = ("SLURM_JOB_ID",)
    ARRAY_INDEX = ("SLURM_ARRAY_TASK_ID",)
    SUBMIT_DIR = ("SLURM_SUBMIT_DIR",)

    def __init__(self, env: Mapping[str, str]):
        super().__init__(env)
        self.job = SlurmJob.from_env(self.env)

    @property
    def nodes(self) -> list[str]:
        return self.job.nodes

    @property
    def task_nodes(self) -> list[str]:
        return self.job.step_nodes or self.job.nodes

    @property
    def tasks(self) -> int | None:
        return self.job.ntasks

    @property
    def node_index(self) -> int | None:
        """``SLURM_NODEID`` inside a step (the batch script has a node id too: its own)."""
        return self.job.nodeid if self.job.in_step else None

    @property
    def cpus_per_task(self) -> int | None:
        return self.job.cpus_per_task

    def rendezvous_key(self) -> str:
        """The job, its step (``batch``: the batch script's own) and its restart: a requeued
        job or a second step never reads an older announcement."""
        step = self.job.step_id if self.job.step_id is not None else "batch"
        return f"{self.job_id}.{step}.{self.env.get('SLURM_RESTART_COUNT', '0')}"


class Lsf(Scheduler):
    """IBM Spectrum LSF: ``LSB_MCPU_HOSTS`` lists ``host slots`` pairs, the first execution
    host first (on Summit-like machines a launch node, which runs no task: jsrun knows it)."""

    name, label = "lsf", "LSF"
    JOB_ID = ("LSB_JOBID",)
    ARRAY_INDEX = ("LSB_JOBINDEX",)  # 0 outside an array
    SUBMIT_DIR = ("LS_SUBCWD",)

    @property
    def nodes(self) -> list[str]:
        pairs = self.env.get("LSB_MCPU_HOSTS", "").split()
        return pairs[0::2] or list(dict.fromkeys(self.env.get("LSB_HOSTS", "").split()))


class Pbs(Scheduler):
    """PBS Pro, OpenPBS and Torque: ``PBS_JOBID`` (``1234.server``; ``1234[5].server`` in an
    array), ``PBS_NODEFILE`` (a file with one line per MPI slot, the first host first)."""

    name, label = "pbs", "PBS"
    JOB_ID = ("PBS_JOBID",)
    ARRAY_INDEX = ("PBS_ARRAY_INDEX", "PBS_ARRAYID")  # PBS Pro's, Torque's
    SUBMIT_DIR = ("PBS_O_WORKDIR",)

    def _slots(self) -> list[str]:
        try:
            return Path(self.env["PBS_NODEFILE"]).read_text().split() if self.env.get("PBS_NODEFILE") else []
        except OSError:
            return []

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(self._slots()))

    @property
    def tasks(self) -> int | None:
        return len(self._slots()) or None


def detect(env: Mapping[str, str]) -> Scheduler | None:
    """The scheduler whose job the process with environment ``env`` runs in, or None."""
    cls = next((c for c in Scheduler.registry if c.detect(env)), None)
    return cls(env) if cls is not None else None


def label(name: str) -> str:
    """A scheduler's name as its documentation writes it: ``label("lsf") == "LSF"``."""
    return next((c.label for c in Scheduler.registry if c.name == name), name)
