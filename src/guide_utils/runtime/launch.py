"""Start N worker processes on this machine with one of the launchers a cluster uses.

Notebooks and ``experiments`` call this to run the multi-worker steps for real at laptop
scale; on a cluster the sbatch scripts in ``slurm_examples/`` do the same with ``srun``.
Each launcher starts ``python -m <module> <args>`` ``workers`` times:

* ``horovodrun``: Horovod's own launcher, here over Gloo (no MPI needed);
* ``mpirun``: OpenMPI, as in the thesis's sbatch scripts;
* ``torchrun``: PyTorch's launcher for DDP (``--standalone``: rendezvous on this machine).

>>> command("torchrun", 2, "guide_utils.train", ["--dist", "ddp"])[1:5]
['--standalone', '--nproc-per-node', '2', '-m']
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Mapping, Sequence

from ..core.errors import GuideError
from . import launchers
from .local import run as run_here
# The workers' environment on this machine; its names are this module's too (callers import them here).
from .local_env import (BIN, IFACE_SITE_VAR, IFACE_VARS, environment, loopback_interface,  # noqa: F401
                        network_interface, other_hosts, route_interface)

LAUNCHERS = tuple(launchers.local_names())  # the ones :func:`command` starts on this machine


def started_by(env: Mapping[str, str] | None = None) -> str | None:
    """Which launcher started this process: ``horovodrun``, ``mpirun`` (any MPI process
    manager, srun with an MPI plugin included), ``torchrun`` (or whoever set torch.distributed's
    RANK and WORLD_SIZE the way it does), ``srun`` (a task of an srun step without MPI), or
    None (a plain process, or the batch script itself). A name to print or record: code
    that needs to know what a launcher can do asks ``runtime.launchers.detect`` instead.

    >>> started_by({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}) is None  # the batch script
    True
    >>> started_by({"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "PMIX_RANK": "1"})
    'mpirun'
    >>> started_by({"OMPI_COMM_WORLD_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"})  # an MPI engine running DDP
    'torchrun'
    """
    launcher = launchers.detect(env)
    return launcher.started_by() if launcher is not None else None


def require_launcher(dist: str, env: Mapping[str, str] | None = None):
    """``(launcher, slurm job)`` for a ``--dist`` run, or a GuideError when no launcher that
    can start one started this process (the batch script itself, a plain ``python``, or
    srun without an MPI plugin for Horovod): ``runtime.launchers.require`` by name."""
    launcher = launchers.require(dist, env)
    return launcher.started_by(), launcher.job


def command(launcher: str, workers: int, module: str, args: list[str], forward: Sequence[str] = (),
            checked: bool = False) -> list[str]:
    """The argv that starts ``workers`` copies of ``python -m module args``; ``forward``:
    the names of variables every worker must get from the caller's environment (mpirun
    passes only those it is told to its ranks; the other launchers pass them all).
    ``checked``: an earlier horovodrun of the caller's started this Horovod, so horovodrun
    skips its build check (guide_utils.runtime.horovodrun); the other launchers have none."""
    python = [sys.executable, "-m", module, *args]
    if launcher == "horovodrun":
        lo = ["--network-interface", loopback_interface() or "lo"]
        horovodrun = [sys.executable, "-m", f"{__package__}.horovodrun"] if checked else [str(BIN / "horovodrun")]
        return [*horovodrun, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", *lo, *python]
    if launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise GuideError("mpirun not found; install OpenMPI (apt-get install openmpi-bin) or use horovodrun")
        passed = [a for name in forward for a in ("-x", name)]
        return [mpirun, *passed, "-np", str(workers), "--oversubscribe", "--bind-to", "none", "-x", "PATH",
                "-x", "OMP_NUM_THREADS", *python]
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(workers), "-m", module, *args]
    raise GuideError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")


# The launchers that have started workers in this process: a later horovodrun skips the build
# check the first one made (``command(checked=True)``); a notebook launches several in a row.
_STARTED: set[str] = set()


def run(launcher: str, workers: int, module: str, args: list[str], *, timeout: float = 900,
        echo: str | None = "[train]") -> subprocess.CompletedProcess:
    """Launch and wait; print rank 0's lines that start with ``echo``; one-line error on failure
    (``local.run``, the guide's one way of running a command, without printing it)."""
    argv = command(launcher, workers, module, args, checked=launcher in _STARTED)
    proc = run_here(argv, timeout=timeout, echo=echo, show=False)
    _STARTED.add(launcher)  # reached only when the launch succeeded
    return proc
