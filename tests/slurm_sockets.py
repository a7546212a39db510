"""Who listens where: the listening TCP sockets of a set of processes, read from /proc, and
which software each belongs to. The tests check with them that the test Slurm's daemons and
its jobs listen on loopback, and name the software that cannot be told to.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

LOOPBACK = ("127.0.0.1", "::1")


def _tcp_listeners() -> dict[int, tuple[str, int]]:
    """Every listening TCP socket of this network namespace: inode -> (address, port)."""
    out: dict[int, tuple[str, int]] = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, raw)
            if addr.startswith("::ffff:") and "." in addr:
                addr = addr[7:]
            out[int(f[9])] = (addr, int(hexport, 16))
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def listener_kind(pid: int, comm: str, port: int) -> str:
    """Which piece of software a listening socket belongs to, for the ones whose bind address
    is hard-coded to "any" and cannot be configured: ``openmpi`` (mpirun's and orted's
    out-of-band channel, each MPI rank's TCP BTL: open-mpi/ompi#12668), ``horovodrun`` (its
    rendezvous HTTP server: ('', port) in horovod/runner/util/network.py), ``torch-store``
    (PyTorch's TCPStore: the torchrun agent's, or a DDP rank 0's under srun at the job's
    rendezvous port), ``tensorflow`` (a worker's gRPC server). Everything else: ``slurm``
    for Slurm's own processes, ``other`` for the rest (Gloo, for one)."""
    if comm in ("slurmctld", "slurmd", "slurmstepd", "srun"):
        return "slurm"
    if comm in ("mpirun", "orted", "prted"):
        return "openmpi"
    if comm == "horovodrun":
        return "horovodrun"
    if comm in ("pt_elastic", "torchrun"):
        return "torch-store"
    if comm.startswith("python"):
        env = _environ(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            cmdline = []
        if not env:  # an exiting process: its memory (environment) is gone before its sockets
            return "exiting"
        if any(v in env for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")):
            return "openmpi"
        if "guide_utils.train_tf" in cmdline:
            return "tensorflow"
        job = env.get("SLURM_JOB_ID", "")
        # Rank 0's store at the job's rendezvous port (the guide's engine and the reader's
        # examples/your_script/train_ddp.py derive it alike).
        if env.get("SLURM_PROCID") == "0" and job.isdigit() and port == 20000 + int(job) % 10000:
            return "torch-store"
    return "other"


def namespace_pids(holder: int) -> list[int]:
    """Every process in the mount namespace of process ``holder``."""
    try:
        ns = os.readlink(f"/proc/{holder}/ns/mnt")
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def listening_sockets(pids: list[int]) -> list[tuple[str, int, str, int]]:
    """(command, pid, address, port) of every listening TCP socket of ``pids``."""
    listeners = _tcp_listeners()
    out = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            match = re.fullmatch(r"socket:\[(\d+)\]", target)
            if match and int(match.group(1)) in listeners:
                out.append((comm, pid, *listeners[int(match.group(1))]))
    return out
