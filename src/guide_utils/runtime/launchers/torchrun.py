"""torchrun (PyTorch's elastic launcher): it starts the processes of a node and sets
torch.distributed's variables itself (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` for the node, ``MASTER_ADDR``/``MASTER_PORT``).

Whoever else sets ``RANK`` and ``WORLD_SIZE`` the way it does is treated as torchrun too:
ipyparallel's MPI engines running DDP (``cluster.interactive``) carry MPI's variables
as well, but their ranks for this run are torch's. Under srun (one torchrun per node) see
``srun_per_node``.
"""

from __future__ import annotations

from typing import Mapping

from .base import Launcher


class Torchrun(Launcher):
    name = "torchrun"
    priority = 30  # before MPI and srun: processes it starts inherit theirs
    backends = ("ddp",)
    local = True  # runtime.launch.command starts it on this machine
    example = "torchrun --nproc-per-node 2 -m guide_utils.train ..."
    RANK = ("RANK",)
    SIZE = ("WORLD_SIZE",)
    LOCAL_RANK = ("LOCAL_RANK",)
    LOCAL_SIZE = ("LOCAL_WORLD_SIZE",)
    NODE_RANK = ("GROUP_RANK",)
    ADDRESS = ("MASTER_ADDR",)
    PORT = ("MASTER_PORT",)

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env)
