"""Starting the guide's workers across the hosts of an emulated cluster (:mod:`.emulated`).

The launchers a cluster uses, each given what it expects of a cluster:

* DDP (``torch-gloo``): one process per host, with the variables torchrun gives each worker
  (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` = host 0);
* Horovod over Gloo: ``horovodrun -H host0:1,host1:1 --gloo`` started on host 0;
* Horovod over MPI: ``mpirun -H host0,host1`` started on host 0, TCP only (no shared memory
  between ranks: they are on different hosts).

horovodrun and mpirun reach the other hosts with ``ssh HOST COMMAND``; here a small
``ssh`` (written for the cluster, first on the launcher's PATH) runs COMMAND in the
namespace that holds HOST's address, on its core. It knows only the cluster's hosts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ...core.errors import GuideError
from .emulated import Cluster

RUNTIMES = ("torch-gloo", "horovod-gloo", "horovod-mpi")
FRAMEWORK = {"torch-gloo": "ddp", "horovod-gloo": "horovod", "horovod-mpi": "horovod"}
SETUP = {"torch-gloo": "ddp", "horovod-gloo": "horovod-gloo", "horovod-mpi": "horovod-mpi"}  # the training's name


def write_ssh(cluster: Cluster, folder: Path) -> Path:
    """``folder/ssh``: ``ssh [options] HOST COMMAND`` for the cluster's hosts only."""
    cases = "\n".join(f"  {addr}) exec {' '.join(cluster.prefix(i))} sh -c \"$*\" ;;"
                      for i, addr in enumerate(cluster.addresses))
    path = folder / "ssh"
    path.write_text(f"""#!/bin/sh
# guide_utils links: "ssh HOST COMMAND" for the hosts of an emulated cluster (network namespaces)
skip() {{ n=0; while [ $# -gt 0 ]; do case "$1" in -o|-p|-i|-l|-F) shift 2; n=$((n+2)) ;; -*) shift; n=$((n+1)) ;;
  *) break ;; esac; done; }}
skip "$@"; shift $n
host="$1"; shift
skip "$@"; shift $n  # as ssh does, options may follow the host (horovodrun puts -o ConnectTimeout there)
case "$host" in
{cases}
  *) echo "links ssh: $host is not a host of this emulated cluster" >&2; exit 255 ;;
esac
""")
    path.chmod(0o755)
    return path


def commands(cluster: Cluster, runtime: str, module: str, args: list[str], folder: Path
             ) -> tuple[list[list[str]], list[dict[str, str]]]:
    """The command lines (and each one's variables) that run ``python -m module args`` on
    every host of ``cluster`` with ``runtime``."""
    python = [sys.executable, "-m", module, *args]
    n = cluster.workers
    if runtime == "torch-gloo":
        return ([[*cluster.prefix(i), *python] for i in range(n)],
                [{**cluster.env(i), "RANK": str(i), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                  "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(i)} for i in range(n)])
    ssh = write_ssh(cluster, folder)
    env = {**cluster.env(0), "PATH": f"{folder}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
                                     f"{os.environ.get('PATH', '')}"}
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # Horovod's rendezvous is its own
        env.pop(name)
    if runtime == "horovod-gloo":
        hosts = ",".join(f"{a}:1" for a in cluster.addresses)
        argv = [str(Path(sys.executable).parent / "horovodrun"), "-np", str(n), "-H", hosts, "--gloo",
                "--network-interface", "eth0", *python]
    elif runtime == "horovod-mpi":
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise GuideError("mpirun not found; install OpenMPI (apt-get install openmpi-bin)")
        argv = [mpirun, "-np", str(n), "-H", ",".join(cluster.addresses), "--mca", "plm_rsh_agent", str(ssh),
                "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include",
                "eth0", "--mca", "oob_tcp_if_include", "eth0", "--bind-to", "none", "-x", "PATH",
                "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", *python]
    else:
        raise GuideError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")
    return [[*cluster.prefix(0), *argv]], [env]


def run(cluster: Cluster, runtime: str, module: str, args: list[str], *, timeout: float = 600):
    """Run ``python -m module args`` on every host with ``runtime``; the processes' results."""
    from ...runtime import local

    with tempfile.TemporaryDirectory(prefix="guide-links-") as tmp:
        argvs, each = commands(cluster, runtime, module, args, Path(tmp))
        return local.run(argvs, each=each, timeout=timeout, show=False)


def comms_sweep(cluster: Cluster, runtime: str, max_bytes: str, *, budget: str = "64M",
                timeout: float = 600) -> list[dict[str, Any]]:
    """The guide's allreduce benchmark (``comms``, sizes only) across the cluster's hosts."""
    with tempfile.TemporaryDirectory(prefix="guide-links-comms-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        run(cluster, runtime, "guide_utils", ["comms", "--runtime", runtime, "--experiments", "sizes",
                                              "--min-bytes", "4", "--max-bytes", max_bytes, "--factor", "16",
                                              "--budget", budget, "--out", str(out)], timeout=timeout)
        if not out.exists():
            raise GuideError(f"comms over {runtime} wrote no rows")
        return [r for r in map(json.loads, out.read_text().splitlines()) if r.get("kind") == "allreduce"]


def train(cluster: Cluster | None, runtime: str | None, flags: list[str], *, timeout: float = 900) -> float:
    """Images/s of a short training run of the guide's engine: across the cluster with
    ``runtime``, or (``cluster`` None) one worker alone, pinned to the first core."""
    from ...runtime import local
    from ..runs import _records_rate

    with tempfile.TemporaryDirectory(prefix="guide-links-train-") as tmp:
        args = [*flags, "--results-dir", tmp, "--no-progress", "--quiet"]
        if cluster is None:
            core = str(sorted(os.sched_getaffinity(0))[0])
            local.run(["taskset", "-c", core, sys.executable, "-m", "guide_utils.train", *args], timeout=timeout,
                      show=False)
        else:
            run(cluster, runtime, "guide_utils.train", [*args, "--dist", FRAMEWORK[runtime]], timeout=timeout)
        return _records_rate(Path(tmp))
