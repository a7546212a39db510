"""Free TCP ports for a rendezvous on this machine, the guide's one way of finding them.

A job started by hand (two ranks of a pitfall, ipyparallel engines trained with DDP, the
test's own Slurm daemons) needs a port nobody else holds: the kernel picks one when a
socket binds to port 0. (A batch job's rendezvous port is a different matter: every rank
must name the same one, derived from the job id and checked on the main node; see
``runtime.rendezvous``.)

>>> a, b = free_ports(2)
>>> a != b and 0 < a < 65536
True
"""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` different TCP ports on ``host``'s interface that nothing listens on right now.

    All ``n`` sockets are held until the last one is bound, so the ports differ. The caveat
    of every such helper: the ports are free when this returns, not reserved; another
    process may take one before the caller binds it (rare on a node of one's own, so the
    callers do not retry).
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def free_port(host: str = LOOPBACK) -> int:
    """One TCP port on ``host``'s interface that nothing listens on right now (the caveat of
    :func:`free_ports`: free, not reserved)."""
    return free_ports(1, host)[0]
