"""A real two-node Slurm on this one machine, for the tests of slurm_examples/.

munged, slurmctld and two slurmd daemons (nodes ``guide-n1`` and ``guide-n2``, both this
host, Slurm's multiple-slurmd mode) run in the foreground as child processes, with every
file (config, munge key and socket, state, spool, logs) in a temporary directory, on free
ports: nothing of a system Slurm or munge is touched, and stopping means killing the PIDs
started here.

The daemons run in a private mount namespace whose /etc/hosts is a bind-mounted copy that
maps the node names (and this host's name) to 127.0.0.1: jobs inherit slurmd's namespace,
so launchers that resolve node names (torchrun's rendezvous host) work, while the real
/etc/hosts is never edited, not even by a test run that is killed. The network namespace is
the host's (a notebook on the host reaches engines started as jobs over 127.0.0.1), so the
daemons are told to listen on loopback only (CommunicationParameters), and
``listening_sockets`` lets the tests check that they, and the jobs, do.

Needs root (slurmd runs jobs as their submitting user) and Debian's slurm-wlm and munge,
installed here when missing (tests/slurm_conf.py, with the configuration's values); the
sockets are read by tests/slurm_sockets.py. Only a machine that cannot host it skips
(:class:`SlurmUnavailable`); any other failure to start is :class:`SlurmStartError`, with
the tail of the daemons' logs, and must fail the tests that need the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import stat
import socket
import subprocess
import threading
import time
import warnings
from pathlib import Path

import host_speed
import leftovers
import slurm_sockets
from slurm_conf import (GPUS_PER_NODE, NODES, SlurmStartError, SlurmUnavailable, ensure_installed, first_job_id,
                        hardware_layout, slurm_values)

from guide_utils.cluster import provision
from guide_utils.runtime.ports import free_ports

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED", "SPECIAL_EXIT"}


@dataclasses.dataclass(frozen=True)
class Crash:
    """A daemon that died while the cluster ran: its name, when (monotonic and clock time),
    its exit status and the last lines of its output."""
    name: str
    at: float
    clock: str
    status: int | None
    tail: list[str]
    restarted: bool

    def __str__(self) -> str:
        return (f"{self.name} died at {self.clock} (status {self.status}): {' | '.join(self.tail)}; "
                + ("restarted" if self.restarted else "left dead (it died four times)"))


def _oom_kills() -> int | None:
    try:
        return host_speed.oom_kills()
    except (OSError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class OomKill:
    """Processes the kernel's out-of-memory killer ended while the cluster ran (any process of
    this machine: it is shared with the book build and the other tests)."""
    at: float
    clock: str
    count: int

    def __str__(self) -> str:
        return (f"the kernel killed {self.count} process(es) of this machine for want of memory at {self.clock} "
                "(a job's task that died with SIGKILL and said nothing may be one)")


class SlurmCluster:
    def __init__(self, root: Path, sample_listeners: bool = False):
        self.root = Path(root)
        # Every second, every socket of every process in the namespace: tens of ms of CPU per
        # sample while jobs run, so only for a module whose tests read seen_listeners.
        self.sample_listeners = sample_listeners
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.holder: subprocess.Popen | None = None
        self.conf = self.root / "slurm.conf"
        # GUIDE_FAKE_GPUS: this Slurm's GPUs are device files with nothing behind them, so the
        # PyTorch engine trains on the CPUs past them in its jobs (it refuses to on a real site).
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "GUIDE_FAKE_GPUS": "1"}
        self.node_timeout = 60.0
        self._sampler: threading.Thread | None = None
        self._sampling = threading.Event()
        self.seen_listeners: set[tuple[str, str, str, int]] = set()  # (command, kind, address, port)
        self.listener_pids: dict[tuple[str, str, str, int], str] = {}  # what each was: pid, command line
        self.crashes: list[Crash] = []  # daemons that died while the cluster ran (restarted since)
        self._given_up: set[subprocess.Popen] = set()
        self._oom_at_start = self._oom_seen = _oom_kills()
        self.oom_kills: list[OomKill] = []  # the kernel's OOM kills while the cluster ran

    def memory_note(self) -> str:
        """What a failed job's message adds: the kernel's OOM kills since the cluster was made
        (a task that died with SIGKILL and said nothing may have been one), and memory in use now."""
        now = _oom_kills()
        if now is None or self._oom_at_start is None:
            return ""
        used, total = host_speed.memory_in_use()
        killed = now - self._oom_at_start
        lines = host_speed.oom_lines() if killed else []
        said = "; the kernel's log: " + " | ".join(lines) if lines else ""
        return (f"\n(this machine: {killed} process(es) killed by the kernel for want of memory since this test "
                f"Slurm was made; {used:.1f} of {total:.1f} GiB in use now{said})")

    # -- start / stop ---------------------------------------------------------------------
    def start(self) -> "SlurmCluster":
        if os.geteuid() != 0:
            raise SlurmUnavailable("the test Slurm needs root (slurmd starts jobs as their user)")
        ensure_installed()
        leftovers.own(self.root)  # a slurmstepd still holding a file here at the run's end is a leftover
        for tool in ("unshare", "nsenter", "mount"):
            if not shutil.which(tool):
                raise SlurmStartError(f"{tool} (util-linux) is missing; the test Slurm runs in a mount namespace")
        r = self.root
        for d in ("state", "log", *(f"spool-{n}" for n in NODES), *(f"tmpfs-{n}" for n in NODES)):
            (r / d).mkdir(parents=True, exist_ok=True)
        self._namespace()
        key = r / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        sock = r / "munge.socket"
        self._spawn(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={r / 'munged.pid'}", f"--log-file={r / 'log/munged.log'}",
                     f"--seed-file={r / 'munged.seed'}"], "munged")
        self._wait_for(sock.exists, 20, "munged did not create its socket")
        ctld_port, *node_ports = free_ports(1 + len(NODES))
        host = socket.gethostname().split(".")[0]
        layout = hardware_layout()
        values = slurm_values(root=r, host=host, ctld_port=ctld_port, node_ports=node_ports, layout=layout,
                              socket=sock, first_job_id=first_job_id())
        # slurm.conf and gres.conf come from the Ansible role's templates: the tests run the
        # configuration the playbook installs (ansible/roles/slurm, guide_utils.cluster.provision).
        self.conf.write_text(provision.render("slurm.conf", values))
        (r / "gres.conf").write_text(provision.render("gres.conf", values))
        self._fake_gpus()
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        for n in NODES:
            self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", n], f"slurmd-{n}")
        self._wait_for(self._nodes_idle, self.node_timeout, "the nodes did not come up idle")
        self._sampling.clear()
        self._sampler = threading.Thread(target=self._watch, daemon=True)
        self._sampler.start()
        return self

    def _fake_gpus(self) -> None:
        """The fake GPUs gres.conf lists: character-device files of the NVIDIA driver's major
        number in this cluster's folder (slurmd refuses regular files); nothing opens them."""
        for n in NODES:
            d = self.root / f"dev-{n}"
            d.mkdir(exist_ok=True)
            for i in range(GPUS_PER_NODE):
                f = d / f"nvidia{i}"
                if not f.exists():
                    os.mknod(f, 0o600 | stat.S_IFCHR, os.makedev(195, i))

    def stop(self) -> None:
        """Cancel every job, stop the daemons, then end whatever is left in their namespace.
        A slurmstepd outlives its slurmd by design (a site restarts slurmd under running
        jobs), so stopping the daemons alone left a job's step running after the session."""
        self._sampling.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        self._cancel_jobs()
        procs = [p for _, p in reversed(self.procs)]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._end_namespace()
        self.procs.clear()
        self.holder = None

    def _cancel_jobs(self, within: float = 30) -> None:
        """scancel every job and wait (at most ``within`` s) until the queue is empty."""
        if not any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
            return  # no controller, no jobs to ask about: the namespace's end below
        end = time.monotonic() + within
        while time.monotonic() < end:
            try:
                out = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True, env=self.env,
                                     timeout=15)
            except subprocess.TimeoutExpired:
                continue
            jobs = out.stdout.split()
            if out.returncode != 0 or not jobs:
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(["scancel", *jobs], capture_output=True, env=self.env, timeout=15)
            time.sleep(1)

    def _end_namespace(self) -> None:
        """SIGKILL every process left in the daemons' mount namespace (slurmstepd, a job's
        tasks), wait until they are gone, then end the namespace's holder."""
        if self.holder is None:
            return
        try:  # never the host's own namespace: only a private one holds nothing but the cluster
            private = os.readlink(f"/proc/{self.holder.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        except OSError:
            private = False
        end = time.monotonic() + 30
        while private and time.monotonic() < end:
            left = [pid for pid in self.namespace_pids() if pid != self.holder.pid]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.wait()

    def _namespace(self) -> None:
        """Start the process that holds the daemons' mount namespace: private mounts (nothing
        propagates to the host), /etc/hosts replaced by a copy that maps the node names and
        this host's name to loopback, and a /dev/shm of its own. It ends, and the mounts with
        it, after the daemons.

        The jobs' own /dev/shm: every test Slurm numbers its jobs from the same first id, and
        two OpenMPI steps of the same job and step id (same PMIx namespace, so same MPI job
        id) on this one host name their shared-memory segments alike. In a shared /dev/shm a
        step of another test Slurm running at the same time (another session's, another
        test run's) attached to the other's segments and its first collective waited forever
        (issue 56: chapter 9's Horovod on Slurm engines at 0 % for 20 minutes)."""
        names = " ".join([*NODES, socket.gethostname(), socket.gethostname().split(".")[0]])
        hosts = self.root / "hosts"
        hosts.write_text(f"127.0.0.1 {names}\n" + Path("/etc/hosts").read_text())
        ready = self.root / "namespace-ready"
        log = open(self.root / "log" / "namespace.stdout", "w")
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             'mount --bind "$1" /etc/hosts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && : >"$2" && '
             'exec sleep infinity', "sh", str(hosts), str(ready)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_for(ready.exists, 10, "the mount namespace for the daemons did not come up")

    def in_namespace(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command in the daemons' (and jobs') mount namespace."""
        assert self.holder is not None, "the cluster is not started"
        return subprocess.run(["nsenter", f"--target={self.holder.pid}", "--mount", "--", *cmd],
                              capture_output=True, text=True, check=check)

    @contextlib.contextmanager
    def tmpfs(self, path: Path, size: str):
        """A tmpfs of ``size`` at ``path`` that the jobs see (it is mounted in their namespace,
        so the host never does); unmounted when the block ends, however it ends, and in any
        case gone with the namespace."""
        path.mkdir(parents=True, exist_ok=True)
        self.in_namespace("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
        try:
            yield path
        finally:
            self.in_namespace("umount", "--lazy", str(path), check=False)

    def _spawn(self, cmd: list[str], name: str) -> None:
        assert self.holder is not None
        self.procs.append((name, self._popen(["nsenter", f"--target={self.holder.pid}", "--mount", "--", *cmd],
                                             name, "w")))
        time.sleep(0.2)
        self._check_alive()

    def _popen(self, argv: list[str], name: str, mode: str) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.stdout", mode)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def _restart_dead(self) -> None:
        """Start again a daemon that died while the cluster ran, as a site's service manager
        does (systemd's Restart=on-failure), and record it in ``crashes``. Debian's Slurm
        22.05 slurmd has been seen to abort here (glibc "malloc(): unaligned tcache chunk
        detected") while launching a step of a job that had just requeued itself; left dead,
        its node goes DOWN after SlurmdTimeout and takes every job on it along."""
        for i, (name, p) in enumerate(self.procs):
            if p.poll() is None or self._sampling.is_set() or p in self._given_up:
                continue
            log = self.root / "log" / f"{name}.stdout"
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            again = sum(c.name == name for c in self.crashes) < 3  # one that cannot start stays dead
            self.crashes.append(Crash(name, time.monotonic(), time.strftime("%H:%M:%S"), p.returncode, tail, again))
            if again:
                self.procs[i] = (name, self._popen(list(p.args), name, "a"))
            else:
                self._given_up.add(p)

    def _watch(self) -> None:
        """Every second while the cluster runs: restart dead daemons, note the kernel's OOM kills,
        sample listeners (if asked)."""
        while not self._sampling.wait(1.0):
            with contextlib.suppress(Exception):
                self._restart_dead()
            self._note_oom()
            if self.sample_listeners:
                self._sample_listeners()

    def _note_oom(self) -> None:
        now = _oom_kills()
        if now is not None and self._oom_seen is not None and now > self._oom_seen:
            self.oom_kills.append(OomKill(time.monotonic(), time.strftime("%H:%M:%S"), now - self._oom_seen))
        self._oom_seen = now

    def crashes_since(self, since: float) -> list["Crash | OomKill"]:
        """The daemon deaths, and the kernel's OOM kills on this machine, recorded at or after
        ``since`` (a time.monotonic() value)."""
        return [c for c in [*self.crashes, *self.oom_kills] if c.at >= since]

    def _check_alive(self) -> None:
        for name, p in [("namespace", self.holder), *self.procs]:
            if p is not None and p.poll() is not None:
                raise SlurmStartError(f"{name} exited at start (status {p.returncode})" + self.logs_tail())

    def logs_tail(self, lines: int = 12) -> str:
        """The last lines of every daemon's log, for failure messages."""
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            text = f.read_text(errors="replace").strip().splitlines()[-lines:]
            parts.append(f"--- {f.name}\n" + ("\n".join(text) if text else "(empty)"))
        return "\n" + "\n".join(parts)

    def _wait_for(self, check, timeout: float, message: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if check():
                return
            self._check_alive()
            time.sleep(0.25)
        raise SlurmStartError(f"{message} within {timeout:.0f} s" + self.logs_tail())

    def _nodes_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=self.env)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    # -- sockets --------------------------------------------------------------------------
    def namespace_pids(self) -> list[int]:
        """The daemons and every process of every job: all that share their mount namespace."""
        assert self.holder is not None
        return slurm_sockets.namespace_pids(self.holder.pid)

    def listening_sockets(self, pids: list[int] | None = None) -> list[tuple[str, int, str, int]]:
        """(command, pid, address, port) of every listening TCP socket of ``pids`` (default:
        the daemons' namespace)."""
        return slurm_sockets.listening_sockets(self.namespace_pids() if pids is None else pids)

    def _sample_listeners(self) -> None:
        """Record what the namespace listens on: ``seen_listeners`` holds (command, kind,
        address, port), kind from ``listener_kind``."""
        with contextlib.suppress(Exception):
            for c, pid, a, p in self.listening_sockets():
                key = (c, slurm_sockets.listener_kind(pid, c, p), a, p)
                if key[1] != "exiting" and key not in self.seen_listeners:
                    self.seen_listeners.add(key)
                    with contextlib.suppress(OSError):
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode()
                        self.listener_pids[key] = f"pid {pid}: {cmd}"

    # -- jobs -----------------------------------------------------------------------------
    def jobs(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job`` for a job (all tasks of an array), one dict per job record."""
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True,
                             env=self.env)
        records = []
        for line in out.stdout.splitlines():
            fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))
            if fields:
                records.append(fields)
        return records

    def finished(self, job_id: str) -> list[dict[str, str]] | None:
        """The job's records if it (every array task) reached a final state, else None."""
        records = self.jobs(job_id)
        # An array shows one pending record for tasks not yet started (ArrayTaskId=1-2).
        pending_array = any(re.search(r"[-,%]", r.get("ArrayTaskId", "")) for r in records)
        if records and not pending_array and all(r.get("JobState") in TERMINAL for r in records):
            return records
        return None

    def wait(self, job_id: str, timeout: float = 600) -> list[dict[str, str]]:
        """Wait until the job (every array task) reached a final state; return its records."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            records = self.finished(job_id)
            if records is not None:
                return records
            time.sleep(0.5)
        subprocess.run(["scancel", str(job_id)], env=self.env)
        raise TimeoutError(f"job {job_id} did not finish within {timeout} s: {self.jobs(job_id)}")


def start_or_skip(cluster: "SlurmCluster") -> "SlurmCluster":
    """Start the cluster. Only "this machine cannot host Slurm" skips; any other failure to
    start fails, with the daemons' logs: a broken Slurm must not pass as a skipped one."""
    import pytest

    try:
        return cluster.start()
    except SlurmUnavailable as exc:
        cluster.stop()
        pytest.skip(f"no test Slurm on this machine: {exc}")
    except SlurmStartError as exc:
        cluster.stop()
        pytest.fail(f"the test Slurm did not start: {exc}", pytrace=False)
    except BaseException:
        cluster.stop()
        raise


def module_cluster(request, tmp_path_factory):
    """The body of every test module's ``cluster`` fixture (module scope): one started test
    Slurm for the module's tests, stopped after them; its listeners sampled where the module
    sets SAMPLE_LISTENERS."""
    c = start_or_skip(SlurmCluster(tmp_path_factory.mktemp("slurm"),
                                   sample_listeners=getattr(request.module, "SAMPLE_LISTENERS", False)))
    yield c
    c.stop()
    for crash in c.crashes:  # in the run's warnings summary, also when no test failed for it
        warnings.warn(f"test Slurm: {crash}", stacklevel=1)


def digits_archive(tmp_path_factory) -> Path:
    """A small real image archive in the ImageNet layout (pack-dataset digits), for staging."""
    out = tmp_path_factory.mktemp("dataset") / "digits.tar"
    subprocess.run([str(Path(__file__).resolve().parents[1] / ".venv/bin/python"), "-m", "guide_utils",
                    "pack-dataset", "digits", str(out)], check=True, capture_output=True)
    return out
