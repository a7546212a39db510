"""A real two-node Slurm on this one machine, for the tests of slurm_examples/.

munged, slurmctld and two slurmd daemons (nodes ``guide-n1`` and ``guide-n2``, both this
host, Slurm's multiple-slurmd mode) run in the foreground as child processes, with every
file (config, munge key and socket, state, spool, logs) in a temporary directory, on free
ports: nothing of a system Slurm or munge is touched, and stopping means killing the PIDs
started here. Node names must resolve for launchers that use them (torchrun's rendezvous
host); when they do not, two loopback entries are added to /etc/hosts and removed again.
Needs root (slurmd runs jobs as their submitting user) and Debian's slurm-wlm and munge,
installed here when missing, as scripts/setup.sh does.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = ("guide-n1", "guide-n2")
HOSTS_TAG = "# added by guide tests (tests/slurm_cluster.py)"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
PACKAGES = ("slurm-wlm", "munge")


class SlurmUnavailable(Exception):
    """This machine cannot run the test cluster; the message says why."""


def ensure_installed() -> None:
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SlurmUnavailable("Slurm and munge are not installed; run: sudo apt-get install -y " + " ".join(PACKAGES))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, capture_output=True)


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.procs: list[subprocess.Popen] = []
        self.added_hosts = False
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start / stop ---------------------------------------------------------------------
    def start(self) -> "SlurmCluster":
        if os.geteuid() != 0:
            raise SlurmUnavailable("the test Slurm needs root (slurmd starts jobs as their user)")
        ensure_installed()
        self._hosts()
        r = self.root
        for d in ("state", "log", *(f"spool-{n}" for n in NODES), *(f"tmpfs-{n}" for n in NODES)):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        sock = r / "munge.socket"
        self._spawn(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={r / 'munged.pid'}", f"--log-file={r / 'log/munged.log'}",
                     f"--seed-file={r / 'munged.seed'}"], "munged")
        self._wait_for(sock.exists, 20, "munged did not create its socket")
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={os.cpu_count()} "
                          f"RealMemory=4000 State=UNKNOWN" for n, p in zip(NODES, node_ports))
        self.conf.write_text(f"""\
ClusterName=guideci
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also sets how long a requeued job waits before it may start again (120 s by
# default): short here, so the requeue test takes seconds, not minutes.
AuthInfo=socket={sock},cred_expire=10
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
# PMIx keeps per-step files under TmpFS: one folder per node, as two nodes share this disk.
TmpFS={r}/tmpfs-%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# Look at pending jobs every few seconds (defaults: 60 s and 30 s): a requeued job is
# eligible again after cred_expire, then waits for the next scheduling pass.
SchedulerParameters=sched_interval=5,bf_interval=5
JobRequeue=1
MinJobAge=3600
KillWait=10
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
{nodes}
PartitionName=ci Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        for n in NODES:
            self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", n], f"slurmd-{n}")
        self._wait_for(self._nodes_idle, 60, "the nodes did not come up idle (see the logs in " + str(r / "log") + ")")
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if self.added_hosts:
            lines = Path("/etc/hosts").read_text().splitlines(keepends=True)
            Path("/etc/hosts").write_text("".join(line for line in lines if HOSTS_TAG not in line))
            self.added_hosts = False

    def _hosts(self) -> None:
        missing = [n for n in NODES if not _resolves(n)]
        if not missing:
            return
        try:
            with open("/etc/hosts", "a") as f:
                f.write(f"127.0.0.1 {' '.join(missing)} {HOSTS_TAG}\n")
        except OSError as exc:
            raise SlurmUnavailable(f"node names {missing} do not resolve and /etc/hosts is not writable ({exc})")
        self.added_hosts = True

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))
        time.sleep(0.2)
        if self.procs[-1].poll() is not None:
            raise SlurmUnavailable(f"{name} exited at start: {(self.root / 'log' / f'{name}.stdout').read_text()[-500:]}")

    @staticmethod
    def _wait_for(check, timeout: float, message: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if check():
                return
            time.sleep(0.5)
        raise SlurmUnavailable(message)

    def _nodes_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=self.env)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

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

    def wait(self, job_id: str, timeout: float = 600) -> list[dict[str, str]]:
        """Wait until the job (every array task) reached a final state; return its records."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            records = self.jobs(job_id)
            # An array shows one pending record for tasks not yet started (ArrayTaskId=1-2).
            pending_array = any(re.search(r"[-,%]", r.get("ArrayTaskId", "")) for r in records)
            if records and not pending_array and all(r.get("JobState") in TERMINAL for r in records):
                return records
            time.sleep(1)
        subprocess.run(["scancel", str(job_id)], env=self.env)
        raise TimeoutError(f"job {job_id} did not finish within {timeout} s: {self.jobs(job_id)}")
