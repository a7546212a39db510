"""IBM Job Step Manager's ``jsrun`` under LSF (Summit- and Sierra-like machines).

jsrun starts every task and tells it ``JSM_NAMESPACE_RANK``, ``JSM_NAMESPACE_SIZE`` and
``JSM_NAMESPACE_LOCAL_RANK`` (IBM's jsrun documentation; PyTorch Lightning's LSF
environment reads the same). The job is LSF's (``runtime.schedulers``: its id, array index
and submission directory, so the rendezvous port derives from ``LSB_JOBID`` as a Slurm
job's from its id). Its hosts, ``LSB_MCPU_HOSTS``, start with the launch node, which runs
the batch script and no task, so the first compute host is the main one: the one thing
said here that LSF does not. The tasks are one PMIx world (Spectrum MPI): Horovod starts,
and DDP with the variables above. This file and its test are all a new launcher needs.
"""

from __future__ import annotations

import socket
from typing import Mapping

from .base import Launcher


class Jsrun(Launcher):
    name = "jsrun"
    binds_each_rank = True  # each resource set on its own cores
    priority = 40  # before MPI: Spectrum MPI's ranks also carry OMPI_COMM_WORLD_*
    family = "mpirun"  # started_by: an MPI process manager
    backends = ("horovod", "ddp")
    scheduler_name = "lsf"
    RANK = ("JSM_NAMESPACE_RANK",)
    SIZE = ("JSM_NAMESPACE_SIZE",)
    LOCAL_RANK = ("JSM_NAMESPACE_LOCAL_RANK",)

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "JSM_NAMESPACE_RANK" in env

    def hosts(self) -> list[str]:
        """The compute hosts, in LSF's order (the launch node left out)."""
        return self.scheduler.nodes[1:] if self.scheduler is not None else []

    @property
    def local_size(self) -> int:
        """The documented variables give no local size: the tasks over the hosts (jsrun
        spreads resource sets evenly unless told otherwise)."""
        hosts = self.hosts()
        return -(-self.world_size // len(hosts)) if hosts else 1

    @property
    def node_rank(self) -> int:
        here = socket.gethostname()
        hosts = self.hosts()
        for name in (here, here.split(".")[0]):
            if name in hosts:
                return hosts.index(name)
        return self.rank // max(self.local_size, 1)

    @property
    def main_address(self) -> str | None:
        return next(iter(self.hosts()), None)
