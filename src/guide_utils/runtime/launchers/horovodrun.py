"""horovodrun (Horovod's launcher, here with its Gloo controller): ``HOROVOD_RANK``,
``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``/``_SIZE``, ``HOROVOD_CROSS_RANK`` (the node) and its
own rendezvous server (``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``). It starts Horovod only."""

from __future__ import annotations

from typing import Mapping

from .base import Launcher


class Horovodrun(Launcher):
    name = "horovodrun"
    priority = 20  # before MPI's variables, which horovodrun --mpi's processes carry too
    backends = ("horovod",)
    local = True  # runtime.launch.command starts it on this machine
    example = "horovodrun -np 2 python -m guide_utils.train ..."
    RANK = ("HOROVOD_RANK",)
    SIZE = ("HOROVOD_SIZE",)
    LOCAL_RANK = ("HOROVOD_LOCAL_RANK",)
    LOCAL_SIZE = ("HOROVOD_LOCAL_SIZE",)
    NODE_RANK = ("HOROVOD_CROSS_RANK",)
    ADDRESS = ("HOROVOD_GLOO_RENDEZVOUS_ADDR",)
    PORT = ("HOROVOD_GLOO_RENDEZVOUS_PORT",)

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "HOROVOD_RANK" in env
