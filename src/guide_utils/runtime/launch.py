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

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from ..core.errors import GuideError
from . import launchers

LAUNCHERS = ("horovodrun", "mpirun", "torchrun")  # the ones :func:`command` starts on this machine
BIN = Path(sys.executable).parent


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


def command(launcher: str, workers: int, module: str, args: list[str], forward: Sequence[str] = ()) -> list[str]:
    """The argv that starts ``workers`` copies of ``python -m module args``; ``forward``:
    the names of variables every worker must get from the caller's environment (mpirun
    passes only those it is told to its ranks; the other launchers pass them all)."""
    python = [sys.executable, "-m", module, *args]
    if launcher == "horovodrun":
        lo = ["--network-interface", loopback_interface() or "lo"]
        return [str(BIN / "horovodrun"), "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", *lo, *python]
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


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


# The variables that pin each transport to one network interface: Gloo (PyTorch's and
# Horovod's), PyTorch's TensorPipe, and OpenMPI's TCP transports (data and out-of-band).
IFACE_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "OMPI_MCA_btl_tcp_if_include",
              "OMPI_MCA_oob_tcp_if_include")
# A site's choice of interface for all of them (exported in its profile, like NCCL_SOCKET_IFNAME).
IFACE_SITE_VAR = "GUIDE_NETWORK_INTERFACE"


def route_interface(host: str) -> str | None:
    """The name of this machine's interface that traffic to ``host`` leaves by: the source
    address the kernel picks for it (a UDP socket's ``connect`` sends no packet), and the
    interface that holds that address. None when ``host`` does not resolve or no
    interface holds the address.

    >>> route_interface("127.0.0.1") == loopback_interface()
    True
    """
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))
            source = s.getsockname()[0]
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == source for a in addrs):
            return name
    return None


def network_interface(hosts: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """The interface the workers on ``hosts`` talk over: loopback when they are all on this
    one host (nothing is reachable from the network); otherwise the site's choice
    (``$GUIDE_NETWORK_INTERFACE``), else the one this host routes to another of the hosts
    by (interface names are the same on a cluster's nodes). None when it cannot be told
    (the transports then choose themselves)."""
    env = os.environ if env is None else env
    others = other_hosts(hosts)
    if not others:
        return loopback_interface()
    if env.get(IFACE_SITE_VAR):
        return env[IFACE_SITE_VAR]
    return route_interface(others[0])


def other_hosts(hosts: list[str]) -> list[str]:
    """``hosts`` that are not this machine (by its name, short name or a loopback name), once each.

    >>> other_hosts([socket.gethostname(), "localhost", "gpu02", "gpu02"])
    ['gpu02']
    """
    here = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost", "127.0.0.1"}
    return [h for h in dict.fromkeys(hosts) if h not in here]


def environment(hosts: list[str] | None = None) -> dict[str, str]:
    """The workers' environment. Workers started here run on this machine (``hosts`` None),
    so their traffic stays on loopback and what they listen on is not reachable from the
    network: the rendezvous address, Gloo (PyTorch's and Horovod's) and OpenMPI's TCP
    transports are pinned to it, unless the caller's environment already says otherwise.
    Workers on several ``hosts`` (MPI engines across an allocation's nodes) are pinned to
    the interface between the nodes instead (:func:`network_interface`), and the
    rendezvous address is left to the launcher."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # workers must find this environment's python
    env.setdefault("OMP_NUM_THREADS", "1")  # two workers on two cores: one thread each
    if os.geteuid() == 0:  # OpenMPI refuses root unless told twice (containers, CI)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    iface = network_interface(hosts or [], env)
    if not other_hosts(hosts or []):
        env.setdefault("MASTER_ADDR", "127.0.0.1")
    if iface:
        for name in IFACE_VARS:
            env.setdefault(name, iface)
    return env


def run(launcher: str, workers: int, module: str, args: list[str], *, timeout: float = 900,
        echo: str | None = "[train]") -> subprocess.CompletedProcess:
    """Launch and wait; print rank 0's lines that start with ``echo``; one-line error on failure
    (``local.run``, the guide's one way of running a command, without printing it)."""
    from .local import run as run_here  # local builds on this module

    return run_here(command(launcher, workers, module, args), timeout=timeout, echo=echo, show=False)
