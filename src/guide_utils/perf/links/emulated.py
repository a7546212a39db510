"""An emulated cluster on this machine: N hosts joined by links of a chosen rate and latency.

Each worker gets a network namespace of its own (its own ``eth0``, address and routes), and
a core of its own where the machine has enough (``taskset``). The namespaces are joined by
veth pairs to a bridge that lives in one more namespace, the switch, so that nothing is
added to this machine's own network: no interface, address or route outside the
namespaces, and no address outside them is ever a target (the hosts are 10.213.0.1 to
10.213.0.N, private, on a bridge no other interface is attached to).

Every worker's ``eth0`` is shaped with ``tc``: a token bucket filter (tbf) at the link's
rate, and, where the kernel has netem, a fixed delay in front of it. A worker's sends leave
by its own ``eth0``, so each direction of every path crosses exactly one shaped link.

:class:`Cluster` builds it and removes everything it made on exit, also after Ctrl-C,
SIGTERM or a failed command; a run killed outright (SIGKILL) leaves namespaces whose owner
is gone, and the next :class:`Cluster` (or ``links clean``) removes them. It needs root
(CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's ``ip`` and ``tc``; without them it stops
with one line saying so. Besides the namespaces it writes one file per host,
``/etc/netns/NAME/hosts`` (which ``ip netns exec`` shows that host as its /etc/hosts), and
removes it with the namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import GuideError
from ..model import parse_latency
from ..units import parse_bandwidth

PREFIX = "guidelk"  # every namespace this module makes is named guidelk<pid>-<what>
SUBNET = "10.213.0"  # hosts .1 to .N: private addresses that exist only inside the namespaces
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
PORT = 29513  # the rendezvous port on the first host (the namespaces have all ports to themselves)
# The transports' interface variables (as runtime.launch.IFACE_VARS): every worker talks over eth0.
IFACE_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "OMPI_MCA_btl_tcp_if_include",
              "OMPI_MCA_oob_tcp_if_include")


@dataclass(frozen=True)
class Link:
    """A link's rate (bytes/s) and the delay netem adds to each packet (seconds, one way)."""

    rate: float
    delay: float = 0.0

    @classmethod
    def of(cls, rate: str, delay: str | None = None) -> "Link":
        """From ``"100Mbit/s"`` and ``"0.5ms"`` (None or ``"0"``: no added delay)."""
        bps = parse_bandwidth(rate)
        if bps * 8 < 1e6 or bps * 8 > 100e9:
            raise GuideError(f"link rate {rate!r} is outside 1 Mbit/s to 100 Gbit/s; write e.g. 100Mbit/s, 1Gbit/s")
        d = 0.0 if delay in (None, "", "0") else parse_latency(delay)
        if d > 1.0:
            raise GuideError(f"delay {delay!r} is over a second; write e.g. 0.1ms or 1ms")
        return cls(bps, d)

    @property
    def mbit(self) -> float:
        return self.rate * 8 / 1e6

    def label(self) -> str:
        rate = f"{self.mbit / 1000:g} Gbit/s" if self.mbit >= 1000 else f"{self.mbit:g} Mbit/s"
        return rate + (f", +{self.delay * 1e3:g} ms" if self.delay else "")

    def tbf(self) -> list[str]:
        """tbf's parameters: the bucket holds 4 ms at the rate (the kernel's timer must refill
        it between ticks) and at least 64 KiB (one segmentation-offload packet); the queue
        holds 50 ms, so TCP sees a queue, not a wall of drops."""
        bits = int(self.rate * 8)
        burst = max(64 * 1024, int(self.rate * 0.004))
        return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "50ms"]


def privileges() -> str | None:
    """Why this process cannot build the links (one line), or None when it can."""
    missing = [tool for tool in ("ip", "tc", "taskset") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (apt-get install iproute2 util-linux)"
    try:
        status = open("/proc/self/status", encoding="ascii").read()
    except OSError:
        return "network namespaces need Linux (no /proc/self/status here)"
    eff = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    lacking = [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not eff >> bit & 1]
    if lacking:
        return (f"building network namespaces and shaping links needs root ({' and '.join(lacking)} missing); "
                "run it as root (sudo) on a machine of your own, or in a container started with --privileged")
    return None


def _sh(argv: list[str], what: str) -> str:
    """Run one ip/tc command; its failure as one line."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise GuideError(f"{what} failed ({' '.join(argv)}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Every namespace this module made that still exists (any run's), and every hosts file
    it wrote for one."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    names = [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]
    files = sorted(p.name for p in ETC.glob(f"{PREFIX}*")) if ETC.is_dir() else []
    return list(dict.fromkeys([*names, *files]))


def _owner(name: str) -> int:
    return int(re.match(rf"{PREFIX}(\d+)-", name).group(1))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


ETC = Path("/etc/netns")  # ip netns exec NAME mounts ETC/NAME/hosts over /etc/hosts for what it runs


def _hosts_file(name: str, address: str) -> None:
    """This machine's name resolves to the host's own address inside its namespace (not to
    127.0.0.1, as /etc/hosts says): Horovod's Gloo advertises the address its host name
    resolves to, and a peer in another namespace cannot reach 127.0.0.1."""
    folder = ETC / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n", encoding="ascii")


def _remove(names: list[str]) -> None:
    """End the processes inside ``names`` (started in them by this module) and delete them;
    deleting a namespace destroys its veth ends and their peers; then its hosts file."""
    for sig, pause in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.2)):
        pids = [int(p) for name in names for p in subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if pids:
            time.sleep(pause)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        shutil.rmtree(ETC / name, ignore_errors=True)
    try:
        ETC.rmdir()  # only when empty: another tool's files there stay
    except OSError:
        pass


def clean(stale_only: bool = True) -> list[str]:
    """Remove the namespaces of runs that are gone (``stale_only``) or of every run; their names."""
    gone = [n for n in namespaces() if not (stale_only and _alive(_owner(n)))]
    _remove(gone)
    return gone


class Cluster:
    """``workers`` namespaces joined through a switch namespace, every link shaped to ``link``.

    Use it as a context manager: entering builds everything (and first removes what killed
    runs left), leaving removes everything, however the block ends."""

    def __init__(self, workers: int, link: Link, *, cores: int | None = None):
        if not isinstance(workers, int) or not 2 <= workers <= 64:
            raise GuideError(f"--workers must be 2 to 64, got {workers!r}")
        self.workers, self.link = workers, link
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.hosts = [f"{self.tag}-{i}" for i in range(workers)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(workers)]
        self.cores = cores or len(os.sched_getaffinity(0))
        self._handlers: dict[int, object] = {}

    @property
    def pinned(self) -> bool:
        """Whether every worker has a core of its own."""
        return self.cores >= self.workers

    def core(self, rank: int) -> int:
        return sorted(os.sched_getaffinity(0))[rank % self.cores]

    def __enter__(self) -> "Cluster":
        reason = privileges()
        if reason:
            raise GuideError(reason)
        clean(stale_only=True)
        for sig in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C does: unwind, so __exit__ removes it all
            self._handlers[sig] = signal.signal(sig, _raise_exit)
        try:
            self._build()
            self.shape(self.link)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        _remove([*self.hosts, self.switch])
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        self._handlers.clear()

    def _build(self) -> None:
        _sh(["ip", "netns", "add", self.switch], "creating the switch namespace")
        _sh(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"], "creating the bridge")
        _sh(["ip", "-n", self.switch, "link", "set", "br0", "up"], "bringing the bridge up")
        for i, (ns, addr) in enumerate(zip(self.hosts, self.addresses)):
            _sh(["ip", "netns", "add", ns], f"creating namespace {ns}")
            _hosts_file(ns, addr)
            _sh(["ip", "-n", self.switch, "link", "add", f"port{i}", "type", "veth", "peer", "name", "eth0",
                 "netns", ns], f"joining {ns} to the switch")
            _sh(["ip", "-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up"], "a switch port")
            _sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"], f"addressing {ns}")
            for dev in ("lo", "eth0"):
                _sh(["ip", "-n", ns, "link", "set", dev, "up"], f"bringing {ns}'s {dev} up")

    def shape(self, link: Link) -> None:
        """Shape every worker's ``eth0`` to ``link`` (replacing the shaping before)."""
        for ns in self.hosts:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"],
                           capture_output=True, timeout=30)
            tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0"]
            if link.delay:
                done = subprocess.run([*tc, "root", "handle", "1:", "netem", "delay", f"{link.delay * 1e6:.0f}us"],
                                      capture_output=True, text=True, timeout=30)
                if done.returncode != 0:
                    raise GuideError(f"this kernel cannot add a delay (tc netem: {done.stderr.strip()}); "
                                     "leave --delay out: the link then has the veth's own latency, which "
                                     "links rate measures")
                _sh([*tc, "parent", "1:", "handle", "2:", *link.tbf()], f"shaping {ns}")
            else:
                _sh([*tc, "root", "handle", "1:", *link.tbf()], f"shaping {ns}")
        self.link = link

    def prefix(self, rank: int) -> list[str]:
        """What runs a command on host ``rank``: in its namespace, on its core."""
        return ["ip", "netns", "exec", self.hosts[rank], "taskset", "-c", str(self.core(rank))]

    def env(self, rank: int) -> dict[str, str]:
        """Host ``rank``'s variables: which interface the transports use, who it is, where rank 0 is."""
        return {**{v: "eth0" for v in IFACE_VARS}, "LINKS_RANK": str(rank), "LINKS_WORKERS": str(self.workers),
                "LINKS_ADDR": self.addresses[rank], "MASTER_ADDR": self.addresses[0], "MASTER_PORT": str(PORT)}

    def qdiscs(self) -> str:
        """What tc says of every worker's eth0 (for a test, or a reader's check)."""
        return "".join(_sh(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "eth0"], "tc show")
                       for ns in self.hosts)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)
