"""srun starting every task itself: one process per rank, ``srun python -m guide_utils.train``.

Ranks, the world and the node come from the step (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
``SLURM_LOCALID``, ``SLURM_NODEID``; the batch script has ``SLURM_PROCID=0`` too but no
``SLURM_STEP_ID``). With an MPI plugin (``srun --mpi=pmix`` or ``pmi2``) each task is also a
rank of one MPI world (``PMIX_RANK``/``PMI_RANK`` equal to its ``SLURM_PROCID``) and Horovod
can start; without one, every task would be its own one-process Horovod job.
"""

from __future__ import annotations

from typing import Mapping

from ..slurm import expand_per_node
from ..variables import read_int
from .base import Launcher

MPI_RANK = ("PMIX_RANK", "PMI_RANK")  # srun's pmix and pmi2 plugins (and every MPI process manager)


class SrunTasks(Launcher):
    name = "srun"
    binds_each_rank = True  # each task on the CPUs of its own --cpus-per-task
    unit = "tasks"
    priority = 50  # after the launchers srun may start (torchrun, horovodrun) and their variables
    scheduler_name = "slurm"
    RANK = ("SLURM_PROCID",)
    SIZE = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    LOCAL_RANK = ("SLURM_LOCALID",)
    NODE_RANK = ("SLURM_NODEID",)

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        if "SLURM_STEP_ID" not in env or "OMPI_COMM_WORLD_RANK" in env:  # Open MPI's mpirun: its daemons' step
            return False
        mpi_rank = read_int(env, *MPI_RANK)
        # An MPI process manager started inside a step (mpirun's daemons, hydra's proxies)
        # numbers its ranks itself: then the task id is its daemon's, not the rank.
        return mpi_rank is None or mpi_rank == read_int(env, "SLURM_PROCID")

    @classmethod
    def starts(cls, dist: str) -> str | None:
        return {"horovod": "srun --mpi=pmix (or the site's $GUIDE_SRUN_MPI)", "ddp": "srun",
                "mwms": "srun (one task per worker)"}.get(dist)

    @property
    def mpi(self) -> bool:
        """Whether srun's MPI plugin made the tasks one MPI world."""
        return any(self.env.get(v) for v in MPI_RANK)

    @property
    def family(self) -> str:  # type: ignore[override]
        return "mpirun" if self.mpi else "srun"  # started_by: an MPI process manager, srun's plugin included

    @property
    def backends(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.mpi:
            return ("horovod", "ddp", "mwms")
        # Horovod without an MPI plugin only as a world of one task.
        return ("ddp", "mwms", "horovod") if self.world_size == 1 else ("ddp", "mwms")

    @property
    def local_size(self) -> int:
        counts = expand_per_node(self.env.get("SLURM_STEP_TASKS_PER_NODE", "")) or (self.job.tasks_per_node if self.job
                                                                               else [])
        node = self.node_rank
        return counts[node] if node < len(counts) else max(counts or [1])

    def world_mismatch_hint(self) -> str:
        return "the MPI Horovod was built with does not speak srun's PMI; try another --mpi= value (srun --mpi=list) " \
               "or mpirun"

    def not_startable(self, dist: str) -> str | None:
        if dist == "horovod" and not self.mpi:
            return (f"srun started {self.world_size} tasks without an MPI plugin, so Horovod would run "
                    f"{self.world_size} separate one-process jobs; use srun --mpi=pmix (see srun --mpi=list) or mpirun")
        return None
