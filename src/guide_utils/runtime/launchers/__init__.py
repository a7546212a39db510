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
defining the class registers it. What the job says (its id, nodes, submission directory)
is the scheduler's, not the launcher's (``runtime.schedulers``: Slurm, LSF, PBS), and the
message for a run that no launcher started lists the registered launchers (:func:`how`).

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
from .. import schedulers
from .base import BACKENDS, Launcher

for _module in pkgutil.iter_modules(__path__):  # every launcher module registers its class
    importlib.import_module(f"{__name__}.{_module.name}")

# What a backend's process does without a launcher.
ALONE = {"horovod": "would train alone", "ddp": "would wait for ranks that never come",
         "mwms": "would wait for workers that never come"}


def registered() -> list[type[Launcher]]:
    """The launcher classes, in the order :func:`detect` tries them."""
    return list(Launcher.registry)


def names() -> list[str]:
    return [c.name for c in Launcher.registry]


def local_names() -> list[str]:
    """The launchers ``runtime.launch.command`` starts on this machine, in the registry's order."""
    return [c.name for c in Launcher.registry if c.local]


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
    env = dict(os.environ if env is None else env)
    ways = how(dist, env)
    if launcher is not None:
        raise GuideError(f"--dist {dist} cannot be started by {launcher.started_by()}; launch it with {ways}")
    job = schedulers.detect(env)
    if job is not None:  # the batch script itself (under Slurm, SLURM_PROCID=0 is set there too)
        raise GuideError(f"--dist {dist} was started directly in the batch script of job {job.job_id} and "
                         f"{ALONE[dist]}; launch it with {ways}")
    example = next((c.example for c in Launcher.registry if c.example and c.starts(dist)), "")
    raise GuideError(f"--dist {dist} needs a launcher: start it with {ways}" + (f", e.g. {example}" if example else "")
                     + " (or use --dist none for one process)")


def how(dist: str, env: Mapping[str, str] | None = None) -> str:
    """How a reader starts a ``--dist`` run, from the registered launchers (``Launcher.starts``):
    those of the scheduler this process runs under (outside a job, ``schedulers.DEFAULT``'s,
    Slurm's), then those that run under any, then each other scheduler's in parentheses.

    >>> how("ddp", {})
    'srun or torchrun (jsrun under LSF)'
    >>> how("horovod", {"PBS_JOBID": "7.pbs01"})
    "horovodrun or mpirun (jsrun under LSF; srun --mpi=pmix (or the site's $GUIDE_SRUN_MPI) under Slurm)"
    """
    job = schedulers.detect(dict(os.environ if env is None else env))
    here = job.name if job is not None else schedulers.DEFAULT
    ways: dict[str, list[str]] = {}
    for cls in Launcher.registry:
        if cls.starts(dist):
            ways.setdefault(cls.scheduler_name, []).append(cls.starts(dist))
    first = _either(ways.pop(here, []) + ways.pop("", []))
    others = "; ".join(f"{_either(w)} under {schedulers.label(name)}" for name, w in ways.items())
    return f"{first} ({others})" if first and others else first or others


def _either(ways: list[str]) -> str:
    return " or ".join(ways) if len(ways) < 3 else f"{', '.join(ways[:-1])} or {ways[-1]}"


def starting(dist: str) -> list[str]:
    """The launchers that can start ``dist`` on this machine without a scheduler, usual one
    first (``runtime.launch.command`` builds their command lines: ``Launcher.local``)."""
    local = [c for c in Launcher.registry if c.local and dist in c.backends]
    return [c.name for c in sorted(local, key=lambda c: c.backends.index(dist))]


def backend_of(name: str) -> str:
    """The usual ``--dist`` backend of the launcher ``name`` (the first it can start)."""
    cls = next((c for c in Launcher.registry if c.name == name), None)
    if cls is None or not isinstance(cls.backends, tuple):
        raise GuideError(f"unknown launcher {name!r}; choose from {', '.join(names())}")
    return cls.backends[0]
