"""Launcher environments: one class per launcher, each in its own module of this package.

A launcher tells the processes it starts who they are through environment variables, each
launcher through its own. A class per launcher (``srun``: srun starting every task;
``srun_per_node``: srun starting torchrun or horovodrun once per node; ``mpirun``;
``horovodrun``; ``torchrun``; ``jsrun``) answers the same questions from them (the
interface is :class:`.base.Launcher`): whether it started this process, the world size and
this process's global, local and node rank, the main address and a rendezvous port that
is checked and agreed on, the GPUs and CPUs of the task, and which ``--dist`` backends it
can start. :func:`detect` picks the one that started this process; the rest of the
package asks it, never a launcher's name. A new launcher is one module here plus its test:
defining the class registers it.

>>> detect({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}) is None  # the batch script: no launcher
True
>>> env = detect({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_STEP_ID": "0",
...               "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
...               "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NODELIST": "gpu[01-02]"})
>>> env.name, env.rank, env.world_size, env.local_rank, env.node_rank, env.main_address
('srun', 5, 8, 1, 1, 'gpu01')
>>> env.can_start("ddp"), env.can_start("horovod")  # no MPI plugin: Horovod would not see one world
(True, False)
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Mapping

from ...core.errors import GuideError
from .base import BACKENDS, Launcher

for _module in pkgutil.iter_modules(__path__):  # every launcher module registers its class
    importlib.import_module(f"{__name__}.{_module.name}")

# How a reader starts each backend, and what happens without a launcher.
HOW = {"horovod": ("srun --mpi=pmix (the site's GUIDE_SRUN_MPI), mpirun or horovodrun", "would train alone"),
       "ddp": ("srun or torchrun", "would wait for ranks that never come"),
       "mwms": ("srun, one task per worker", "would wait for workers that never come")}
EXAMPLE = {"horovod": "horovodrun -np 2 python -m guide_utils.train ...",
           "ddp": "torchrun --nproc-per-node 2 -m guide_utils.train ..."}


def registered() -> list[type[Launcher]]:
    """The launcher classes, in the order :func:`detect` tries them."""
    return list(Launcher.registry)


def names() -> list[str]:
    return [c.name for c in Launcher.registry]


def detect(env: Mapping[str, str] | None = None) -> Launcher | None:
    """The environment of the launcher that started this process (``env``, default
    ``os.environ``), or None: a plain process, or a batch script itself."""
    env = dict(os.environ if env is None else env)
    cls = next((c for c in Launcher.registry if c.detect(env)), None)
    return cls(env) if cls is not None else None


def require(dist: str, env: Mapping[str, str] | None = None) -> Launcher:
    """The launcher environment for a ``--dist`` run, or a one-line GuideError when no
    launcher that can start one started this process."""
    if dist not in BACKENDS:
        raise ValueError(f"dist must be one of {', '.join(BACKENDS)}, got {dist!r}")
    launcher = detect(env)
    if launcher is not None and launcher.can_start(dist):
        return launcher
    reason = launcher.not_startable(dist) if launcher is not None else None
    if reason:
        raise GuideError(reason)
    how, what = HOW[dist]
    if launcher is not None:
        raise GuideError(f"--dist {dist} cannot be started by {launcher.started_by()}; launch it with {how}")
    from ..slurm import SlurmJob

    job = SlurmJob.from_env(os.environ if env is None else env)
    if job is not None:  # the batch script itself: SLURM_PROCID=0 is set there too
        raise GuideError(f"--dist {dist} was started directly in the batch script of job {job.job_id} and "
                         f"{what}; launch it with {how}")
    example = EXAMPLE.get(dist, "")
    raise GuideError(f"--dist {dist} needs a launcher: start it with {how}" + (f", e.g. {example}" if example else "")
                     + " (or use --dist none for one process)")


def starting(dist: str) -> list[str]:
    """The launchers that can start ``dist`` on this machine without a scheduler, usual one
    first (``runtime.launch.command`` builds their command lines)."""
    from ..launch import LAUNCHERS

    local = [c for c in Launcher.registry if c.name in LAUNCHERS and dist in c.backends]
    return [c.name for c in sorted(local, key=lambda c: c.backends.index(dist))]


def backend_of(name: str) -> str:
    """The usual ``--dist`` backend of the launcher ``name`` (the first it can start)."""
    cls = next((c for c in Launcher.registry if c.name == name), None)
    if cls is None or not isinstance(cls.backends, tuple):
        raise GuideError(f"unknown launcher {name!r}; choose from {', '.join(names())}")
    return cls.backends[0]
