"""srun starting one launcher per node (``srun --ntasks-per-node=1 torchrun ...``, or
horovodrun in a step): the launcher's variables give the ranks, the step's the node.

The task srun made holds the CPUs and GPUs of every process that launcher starts on its
node, so each process asks for its share: the task's ``--cpus-per-task`` over the node's
processes, and the node's GPUs by local rank. ``SLURM_PROCID`` is the node's task here,
never the rank (the per-task check used to read it as one).
"""

from __future__ import annotations

from typing import Mapping

from .base import Launcher
from .horovodrun import Horovodrun
from .torchrun import Torchrun


class SrunPerNode(Launcher):
    name = "srun-per-node"
    priority = 10  # first: its processes carry both the launcher's and the step's variables
    scheduler_name = "slurm"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "SLURM_STEP_ID" in env and ("TORCHELASTIC_RUN_ID" in env or Horovodrun.detect(env))

    def __init__(self, env: Mapping[str, str] | None = None):
        super().__init__(env)
        self.inner = Horovodrun(self.env) if Horovodrun.detect(self.env) else Torchrun(self.env)
        self.RANK, self.SIZE = self.inner.RANK, self.inner.SIZE
        self.LOCAL_RANK, self.LOCAL_SIZE = self.inner.LOCAL_RANK, self.inner.LOCAL_SIZE
        self.NODE_RANK = (*self.inner.NODE_RANK, "SLURM_NODEID")
        self.ADDRESS, self.PORT = self.inner.ADDRESS, self.inner.PORT

    @property
    def family(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def backends(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.backends

    def cpus_asked(self) -> int | float | None:
        asked = super().cpus_asked()
        if asked is None:
            return None
        share = asked / max(self.local_size, 1)
        return int(share) if share.is_integer() else round(share, 2)
