"""The test Slurm's configuration: what this machine needs to host it (root, two usable
CPUs, Debian's slurm-wlm and munge, installed here when missing, as scripts/setup.sh does),
and the Ansible slurm role's variables for two nodes on loopback. tests/slurm_cluster.py
renders the role's templates with them; tests/test_ansible.py applies the role with the
same lists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

NODES = ("guide-n1", "guide-n2")
# Fake GPUs per node: GRES on placeholder device files (no driver behind them), so that
# --gres=gpu:N, --gpus-per-node and --gpus-per-task allocations are really made and Slurm
# sets CUDA_VISIBLE_DEVICES per step and task as on a GPU cluster.
GPUS_PER_NODE = 4
# Jobs that may share one CPU: the nodes have the machine's real CPUs (so task/affinity's
# binding is real), and the test jobs, which mostly wait, run several at once on them.
OVERSUBSCRIBE = 8
PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")


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
