"""An MPI process manager that numbers the ranks itself: Open MPI's ``mpirun``
(``OMPI_COMM_WORLD_*``; 4.1 and 5 also set ``PMIX_RANK``), MPICH's and Intel MPI's hydra
(``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``), started in the batch
script. Inside a Slurm job it starts its daemons with srun, so its ranks carry that step's
``SLURM_*`` variables: the task id there is the daemon's (its node's), not the rank, and the
step's node id (the scheduler's ``node_index``) is the node. Under PBS (MPICH's or Cray's
``mpiexec``) or LSF the job's facts come from those schedulers alike (``runtime.schedulers``).
It starts Horovod (whose MPI controller meets the ranks).
"""

from __future__ import annotations

from typing import Mapping

from .base import Launcher


class Mpirun(Launcher):
    name = "mpirun"
    priority = 60  # last: srun with an MPI plugin sets PMI's variables too (launchers.srun)
    backends = ("horovod",)
    RANK = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
    SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    LOCAL_RANK = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
    local = True  # runtime.launch.command starts it on this machine

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return any(v in env for v in cls.RANK)

    @property
    def world_size(self) -> int:
        size = self._read(self.SIZE)
        if size is None and self.scheduler is not None:  # PMIx alone does not export the size
            return self.scheduler.tasks or 1
        return size or 1

    @property
    def node_rank(self) -> int:
        """The node of its daemon's task, where the scheduler says (a Slurm step's node id);
        elsewhere rank // local size."""
        node = self.scheduler.node_index if self.scheduler is not None else None
        return node if node is not None else self.rank // max(self.local_size, 1)

    @property
    def main_address(self) -> str | None:
        # Rank 0 runs on the allocation's first node (mpirun maps ranks from there); the
        # daemons' step names only the other nodes when mpirun runs on the first one.
        nodes = self.scheduler.nodes if self.scheduler is not None else []
        return nodes[0] if nodes else None

    def world_mismatch_hint(self) -> str:
        return "Horovod was built against another MPI than this mpirun's; use the mpirun of Horovod's MPI"
