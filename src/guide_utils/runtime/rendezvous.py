"""The rendezvous port of a batch job: derived from the job id, checked, and agreed on.

Every rank of a job must name the same port without talking to the others, so the first
choice is a function of the job id alone (:func:`derived_port`: ``20000 + id % 10000``).
Two jobs sharing a node can still meet there (ids 10,000 apart), and so can any other
program that holds the port. So the port is checked on the main node before use:

* a launcher's own port wins (``MASTER_PORT`` set by torchrun, by the batch script, by
  the user): nothing is checked, nothing waited for;
* otherwise the main rank (rank 0, on the main node, where the rendezvous server will
  listen) takes the derived port if nothing holds it, else one the kernel says is free,
  and announces its choice in a small file that every other rank waits for
  (:func:`agree`). The file lives in ``$GUIDE_RENDEZVOUS_DIR``, else the job's submission
  directory (the scheduler's, ``runtime.schedulers``: Slurm's ``$SLURM_SUBMIT_DIR``, LSF's
  ``$LS_SUBCWD``, PBS's ``$PBS_O_WORKDIR``; shared by the nodes on any cluster whose jobs
  write their output there), else the working directory; it is named by the job, step (or
  array index) and restart, so a requeued job or a second step never reads an older choice,
  and the main rank removes it once every rank has joined (:func:`release`).

``python -m guide_utils rendezvous`` (the batch script's answer for torchrun's
``--rdzv-endpoint``) runs on the main node itself and makes the same check there.

>>> derived_port(5120337)
20337
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Mapping

from ..core.errors import GuideError
from .ports import free_port

# Rendezvous ports are taken from 20000-29999: above the well-known and registered ports
# most services use, below Linux's ephemeral range (32768-60999) where the kernel hands out
# client ports, and wide enough that job ids rarely collide on a shared node.
PORT_BASE = 20000
PORT_SPAN = 10000
DIR_VAR = "GUIDE_RENDEZVOUS_DIR"
WAIT_S = 600.0  # how long a rank waits for the main rank's choice (its imports, a slow file system)


def derived_port(job_id: int) -> int:
    """The port every rank of job ``job_id`` computes alike: the first choice."""
    return PORT_BASE + job_id % PORT_SPAN


def is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` of every interface of this host now (as
    torch's TCPStore does). SO_REUSEADDR as servers set it: a port whose last connection
    is closing (TIME_WAIT, e.g. an earlier step's) counts as free, a listening one does not."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def checked_port(derived: int) -> int:
    """``derived`` if it is free on this host, else a port the kernel says is free."""
    return derived if is_free(derived) else free_port("")


def announce_file(env: Mapping[str, str], submit_dir: tuple[str, ...], key: str) -> Path:
    """Where the main rank of the run ``key`` announces its choice: ``$GUIDE_RENDEZVOUS_DIR``,
    else the first of the ``submit_dir`` variables set (the job's submission directory),
    else the working directory."""
    folder = next((env[n] for n in (DIR_VAR, *submit_dir) if env.get(n)), None) or os.getcwd()
    return Path(folder) / f".guide-rendezvous-{key}"


def agree(path: Path, derived: int, is_main: bool, *, wait_s: float = WAIT_S) -> int:
    """The port all ranks use: the main rank checks ``derived`` and writes its choice to
    ``path`` (:func:`announce_file`); the others wait for it there."""
    if is_main:
        port = checked_port(derived)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(f"{port}\n")
            tmp.replace(path)  # atomic: a reader sees the whole number or no file
        except OSError as exc:
            raise GuideError(f"cannot announce the rendezvous port in {path.parent} ({exc.strerror}); set "
                             f"{DIR_VAR} to a directory every node of the job can write and read") from None
        return port
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text())
        time.sleep(0.2)
    raise GuideError(f"rank 0 announced no rendezvous port in {path} within {wait_s:g} s: did rank 0 start? Is "
                     f"{path.parent} shared by the nodes? If not, set {DIR_VAR} to a directory they share, or export "
                     "MASTER_PORT in the batch script")


def release(path: Path) -> None:
    """Remove the announcement (the main rank, once every rank has joined)."""
    with contextlib.suppress(OSError):
        path.unlink()
