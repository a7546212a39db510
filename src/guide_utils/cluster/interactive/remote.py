"""What runs on the engines: ipyparallel sends these functions by name, and each engine
imports this module to run them (so it holds nothing the engines cannot import).
"""

from __future__ import annotations

import os
import socket
import sys

from ...core.config import TrainConfig


def whoami() -> tuple[int, int, str, int]:
    """(MPI rank, world size, host, process id) of this engine."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), socket.gethostname(), os.getpid()


def run_on_engine(cfg: TrainConfig, rendezvous: tuple[str, int] | None):
    """One rank of the job: the engine's MPI rank; for DDP, torchrun's variables for this run."""
    from mpi4py import MPI

    from .watch import STARTED

    world = MPI.COMM_WORLD  # the first line, before torch's import: the request reached this engine
    print(STARTED.format(rank=world.Get_rank(), size=world.Get_size(), host=socket.gethostname(), pid=os.getpid()),
          flush=True)
    from ...engine import train

    env: dict[str, str] = {}
    if rendezvous is not None:
        node = world.Split_type(MPI.COMM_TYPE_SHARED)
        env = {"RANK": str(world.Get_rank()), "WORLD_SIZE": str(world.Get_size()),
               "LOCAL_RANK": str(node.Get_rank()), "LOCAL_WORLD_SIZE": str(node.Get_size()),
               "MASTER_ADDR": rendezvous[0], "MASTER_PORT": str(rendezvous[1])}
        node.Free()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return train(cfg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.stdout.flush()

