"""The environment of workers started on this machine, and the network interface they talk over.

``runtime.local.run`` starts every worker, launcher and tool in :func:`environment`: this
environment's ``python`` first on the PATH, one thread per worker, OpenMPI allowed to run as
root, and the transports (Gloo, TensorPipe, OpenMPI's TCP) pinned to loopback, or to the
interface between the hosts when the workers span several (:func:`network_interface`).
``runtime.launch`` builds the launchers' command lines on top of it.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Mapping

BIN = Path(sys.executable).parent


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
