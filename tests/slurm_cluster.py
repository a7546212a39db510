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
installed here when missing, as scripts/setup.sh does. Only that is a reason to skip
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

from guide_utils.cluster import provision
from guide_utils.runtime.ports import free_ports

NODES = ("guide-n1", "guide-n2")
# Fake GPUs per node: GRES on placeholder device files (no driver behind them), so that
# --gres=gpu:N, --gpus-per-node and --gpus-per-task allocations are really made and Slurm
# sets CUDA_VISIBLE_DEVICES per step and task as on a GPU cluster.
GPUS_PER_NODE = 4
# Jobs that may share one CPU: the nodes have the machine's real CPUs (so task/affinity's
# binding is real), and the test jobs, which mostly wait, run several at once on them.
OVERSUBSCRIBE = 8
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED", "SPECIAL_EXIT"}
PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")
LOOPBACK = ("127.0.0.1", "::1")


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


class SlurmUnavailable(Exception):
    """This machine cannot host the test cluster (not root; Slurm or munge missing and not
    installable): the one reason to skip."""


class SlurmStartError(Exception):
    """The test cluster should start here but did not; the message ends with the daemons' logs."""


def ensure_installed() -> None:
    if all(shutil.which(b) for b in BINARIES):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SlurmUnavailable("Slurm and munge are not installed; run: sudo apt-get install -y " + " ".join(PACKAGES))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise SlurmUnavailable(f"Slurm and munge are missing and `{' '.join(cmd)}` failed: {tail}")


def first_job_id() -> int:
    """1, or 2501, 5001, 7501 for the 2nd-4th pytest-xdist worker (gw1-gw3): the clusters of
    concurrent workers number their jobs apart, so the ports derived from job ids (the
    rendezvous at 20000 + id % 10000, TensorFlow's 1000 above it) never meet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return 1 + 2500 * (int(worker.removeprefix("gw")) % 4)


def hardware_layout() -> str:
    """The node description slurmd detects on this machine (``slurmd -C``: CPUs, boards,
    sockets, cores, threads), so that the CPU ids Slurm binds tasks to exist. Fewer than two
    CPUs cannot host the tests' two-task jobs, and a process restricted to a subset of the
    CPUs (a container's cpuset) would have Slurm bind tasks to CPUs it may not use."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True)
    fields = dict(re.findall(r"(\w+)=(\S+)", out.stdout))
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    if out.returncode != 0 or not all(k in fields for k in keys):
        raise SlurmStartError(f"`slurmd -C` did not describe this machine: {(out.stdout + out.stderr).strip()[:300]}")
    cpus = int(fields["CPUs"])
    usable = len(os.sched_getaffinity(0))
    if cpus < 2:
        raise SlurmUnavailable(f"the test Slurm needs at least 2 CPUs (this machine has {cpus})")
    if usable != cpus:
        raise SlurmUnavailable(f"this process may use {usable} of the machine's {cpus} CPUs (a restricted cpuset): "
                               "Slurm would bind test jobs to CPUs they cannot use")
    return " ".join(f"{k}={fields[k]}" for k in keys)


def slurm_values(*, root: Path, host: str, ctld_port: int, node_ports: list[int], layout: str, socket: Path,
                 first_job_id: int, real_memory: int = 4000, partition: str = "ci") -> dict:
    """The slurm role's variables (ansible/roles/slurm/defaults/main.yml) for the tests'
    two-node Slurm on loopback: every file under ``root``, both nodes on this host (Slurm's
    multiple-slurmd mode, a port each), fake GPUs on device files under ``root/dev-NODE``."""
    r = Path(root)
    return {
        "slurm_header": "The tests' Slurm (tests/slurm_cluster.py), from ansible/roles/slurm/templates",
        "slurm_cluster_name": "guideci",
        # Job ids of this cluster's own range: a DDP job's rendezvous port is 20000 + its id,
        # and a test Slurm of another pytest-xdist worker may run at the same time here.
        "slurm_first_job_id": first_job_id,
        "slurm_controller_name": host,
        "slurm_controller_addr": "127.0.0.1",
        "slurm_ctld_port": ctld_port,
        "slurm_srun_port_range": "",
        "slurm_user": "root",
        "slurm_slurmd_user": "root",
        # cred_expire also sets how long a requeued job waits before it may start again
        # (120 s by default): short here, so the requeue test takes seconds.
        "slurm_auth_info": [f"socket={socket}", "cred_expire=10"],
        # Listen on the address this host's name resolves to (127.0.0.1 in the daemons' hosts
        # file), not on every interface: slurmctld, slurmd, slurmstepd and srun alike.
        "slurm_communication_parameters": ["NoCtldInAddrAny", "NoInAddrAny"],
        "slurm_state_dir": f"{r}/state",
        "slurm_spool_dir": f"{r}/spool-%n",
        "slurm_ctld_pid_file": f"{r}/slurmctld.pid",
        "slurm_slurmd_pid_file": f"{r}/slurmd-%n.pid",
        "slurm_log_dir": f"{r}/log",
        "slurm_per_node_suffix": "-%n",
        # PMIx keeps per-step files under TmpFS: one folder per node, as two nodes share this disk.
        "slurm_tmpfs": f"{r}/tmpfs-%n",
        "slurm_proctrack_type": "proctrack/linuxproc",
        # Tasks are bound to the CPUs Slurm allocates them, as on a real cluster: a step that
        # did not get --cpus-per-task really gets fewer CPUs. Each task is bound to its own
        # share where the job asks (--cpu-bind=cores, as the Perlmutter-like profile and the
        # per-task check's tests do); otherwise a step's tasks share its CPUs (None), so the
        # test jobs, which share the machine's few cores, are not each pinned to one of them.
        "slurm_task_plugin": ["task/affinity"],
        "slurm_task_plugin_param": "None",
        "slurm_gres_types": ["gpu"],
        "slurm_gres_autodetect": "off",
        # CPUs (hardware threads) are the unit, so a machine with SMT still fits two tasks per core.
        "slurm_select_type_parameters": "CR_CPU",
        "slurm_mpi_default": "none",
        # Look at pending jobs every few seconds (defaults: 60 s and 30 s): a requeued job is
        # eligible again after cred_expire, then waits for the next scheduling pass.
        "slurm_scheduler_parameters": ["sched_interval=2", "bf_interval=2"],
        "slurm_min_job_age": 3600,
        "slurm_kill_wait": 10,
        "slurm_extra_config": [],
        "slurm_cgroup_plugin": "autodetect",
        "slurm_nodes": [
            {"name": n, "hostname": host, "addr": "127.0.0.1", "port": p, "hardware": layout,
             "real_memory": real_memory, "gpus": GPUS_PER_NODE, "gpu_type": "",
             "gpu_files": f"{r}/dev-{n}/nvidia[0-{GPUS_PER_NODE - 1}]"}
            for n, p in zip(NODES, node_ports)],
        "slurm_partitions": [{"name": partition, "nodes": list(NODES), "default": True, "max_time": "INFINITE",
                              "oversubscribe": f"FORCE:{OVERSUBSCRIBE}"}],
    }


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


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.holder: subprocess.Popen | None = None
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.node_timeout = 60.0
        self._sampler: threading.Thread | None = None
        self._sampling = threading.Event()
        self.seen_listeners: set[tuple[str, str, str, int]] = set()  # (command, kind, address, port)
        self.listener_pids: dict[tuple[str, str, str, int], str] = {}  # what each was: pid, command line
        self.crashes: list[Crash] = []  # daemons that died while the cluster ran (restarted since)
        self._given_up: set[subprocess.Popen] = set()

    # -- start / stop ---------------------------------------------------------------------
    def start(self) -> "SlurmCluster":
        if os.geteuid() != 0:
            raise SlurmUnavailable("the test Slurm needs root (slurmd starts jobs as their user)")
        ensure_installed()
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
        self._sampling.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        procs = [p for _, p in reversed(self.procs)] + ([self.holder] if self.holder else [])
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        self.holder = None

    def _namespace(self) -> None:
        """Start the process that holds the daemons' mount namespace: private mounts (nothing
        propagates to the host), /etc/hosts replaced by a copy that maps the node names and
        this host's name to loopback. It ends, and the mounts with it, after the daemons."""
        names = " ".join([*NODES, socket.gethostname(), socket.gethostname().split(".")[0]])
        hosts = self.root / "hosts"
        hosts.write_text(f"127.0.0.1 {names}\n" + Path("/etc/hosts").read_text())
        ready = self.root / "namespace-ready"
        log = open(self.root / "log" / "namespace.stdout", "w")
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             'mount --bind "$1" /etc/hosts && : >"$2" && exec sleep infinity', "sh", str(hosts), str(ready)],
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
        """Every second while the cluster runs: restart dead daemons, sample listeners."""
        while not self._sampling.wait(1.0):
            with contextlib.suppress(Exception):
                self._restart_dead()
            self._sample_listeners()

    def crashes_since(self, since: float) -> list["Crash"]:
        """The daemon deaths recorded at or after ``since`` (a time.monotonic() value)."""
        return [c for c in self.crashes if c.at >= since]

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
        try:
            ns = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
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

    def listening_sockets(self, pids: list[int] | None = None) -> list[tuple[str, int, str, int]]:
        """(command, pid, address, port) of every listening TCP socket of ``pids`` (default:
        the daemons' namespace)."""
        listeners = _tcp_listeners()
        out = []
        for pid in self.namespace_pids() if pids is None else pids:
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

    def _sample_listeners(self) -> None:
        """Record what the namespace listens on: ``seen_listeners`` holds (command, kind,
        address, port), kind from ``listener_kind``."""
        with contextlib.suppress(Exception):
            for c, pid, a, p in self.listening_sockets():
                key = (c, listener_kind(pid, c, p), a, p)
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


def module_cluster(tmp_path_factory):
    """The body of every test module's ``cluster`` fixture (module scope): one started test
    Slurm for the module's tests, stopped after them."""
    c = start_or_skip(SlurmCluster(tmp_path_factory.mktemp("slurm")))
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
