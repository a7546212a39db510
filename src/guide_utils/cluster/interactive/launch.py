"""Starting an interactive cluster's pieces: the checks before anything starts (ipyparallel,
mpi4py and mpiexec, the allocation's tasks), the controller's address, and what the engines
are started with (environment, mpiexec's options).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ...core.errors import GuideError
from ...core.paths import pythonpath
from ...runtime.ports import LOOPBACK


def require_ipyparallel():
    """ipyparallel, or one line saying how to get it."""
    try:
        import ipyparallel
    except ImportError:
        raise GuideError(f"ipyparallel is not installed in this kernel's environment ({sys.executable}); install "
                         "the guide's pins: pip install -r requirements.txt (ipyparallel==9.2.0, mpi4py)") from None
    return ipyparallel


def require_mpi(n: int) -> None:
    """mpi4py, mpiexec, and no more engines than this allocation's tasks; else one line."""
    if importlib.util.find_spec("mpi4py") is None:
        raise GuideError(f"mpi4py is not installed in this kernel's environment ({sys.executable}); MPI engines need "
                         "it: pip install -r requirements.txt (mpi4py, built against your MPI)")
    if not shutil.which("mpiexec"):
        raise GuideError("mpiexec not found: load your MPI (module load ...) or apt-get install openmpi-bin; "
                         "or use engines='slurm'")
    from ...runtime.slurm import SlurmJob

    job = SlurmJob.from_env()
    if job is not None and n > job.ntasks:
        raise GuideError(f"{n} engines asked for, but this Slurm job ({job.job_id}) has {job.ntasks} task(s); "
                         f"ask for at most {job.ntasks}, or start the session with more tasks")


def controller_address(ip: str | None) -> str:
    """Where the controller listens: ``ip``, else $GUIDE_CONTROLLER_IP, else loopback."""
    return ip or os.environ.get("GUIDE_CONTROLLER_IP") or LOOPBACK


def connection_info(profile_dir: str, cluster_id: str, timeout: float = 30) -> dict:
    """The controller's engine connection file, once it is whole: the controller writes it
    in place, so the file can exist and still be empty or half written (seen in CI)."""
    path = Path(profile_dir) / "security" / f"ipcontroller-{cluster_id}-engine.json"
    end = time.monotonic() + timeout
    while True:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            if time.monotonic() > end:
                raise GuideError(f"the ipyparallel controller wrote no complete connection file ({path}) in "
                                 f"{timeout:.0f} s; its log is in {Path(profile_dir) / 'log'}") from None
            time.sleep(0.1)


def controller_endpoint(info: dict) -> tuple[str, int]:
    """(host, registration port) at which the engines reach the controller."""
    host = info["interface"].split("://", 1)[-1]
    if host in ("0.0.0.0", "*"):
        host = info.get("location") or socket.gethostname()
    return host, int(info["registration"])


def engine_port_spec(ports: str | list[int] | None, needed: int = 9) -> str | None:
    """The controller's engine ports as ipyparallel reads them ("50000-50008" or "1,3-5"),
    checked: at least ``needed`` ports (every socket the engines connect to), each a valid
    port; one line otherwise. None: ports the kernel picks.

    >>> engine_port_spec("50000-50019"), engine_port_spec([50000 + i for i in range(9)])[:17]
    ('50000-50019', '50000,50001,50002')
    """
    if ports is None or ports == "":
        return None
    spec = ports if isinstance(ports, str) else ",".join(str(int(p)) for p in ports)
    try:
        values: list[int] = []
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            values += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise GuideError(f"controller ports {spec!r}: give a range such as 50000-50019 (or a list of ports)") from None
    if len(set(values)) < needed or not all(0 < v < 65536 for v in values):
        raise GuideError(f"controller ports {spec!r}: the engines connect to {needed} ports of the controller; give "
                         f"at least {needed} distinct ports between 1 and 65535, e.g. 50000-{50000 + needed - 1}")
    return spec


def controller_engine_ports(info: dict) -> dict:
    """The controller's ports the engines connect to, by name, from its connection file."""
    return {k: info[k] for k in ("registration", "control", "mux", "task", "iopub", "hb_ping", "hb_pong",
                                 "broadcast") if k in info}


def engine_environment(engines: str, n: int) -> dict[str, str]:
    """What the engines need besides the notebook's own environment: this guide_utils on
    their path and, for MPI engines, the batch path's settings (launch.environment: the
    transports on loopback when the engines share this node, on the interface between the
    nodes when mpiexec spreads them over an allocation's nodes). When the
    engines have no core to spare (the kernel and the controller share the node with them),
    OpenMPI yields while it waits instead of spinning: changes no number, and on two cores
    halved the time of a 2-engine Horovod run."""
    env = {"PYTHONPATH": pythonpath(), "PYTHONUNBUFFERED": "1"}
    if engines == "mpi":
        from ...runtime.launch import environment

        full = environment(engine_hosts())
        env.update({k: v for k, v in full.items() if os.environ.get(k) != v})
        if n >= (os.cpu_count() or 1) and "OMPI_MCA_mpi_yield_when_idle" not in os.environ:
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"  # a setting of the notebook's own stands
    return env


def engine_hosts() -> list[str]:
    """The hosts mpiexec may start engines on: the allocation's nodes inside a Slurm job
    (OpenMPI's mpiexec uses all of them), else this host alone (an empty list)."""
    from ...runtime.slurm import SlurmJob

    job = SlurmJob.from_env()
    return job.nodes if job is not None and len(job.nodes) > 1 else []


def mpiexec_args() -> list[str]:
    """OpenMPI's mpiexec: more engines than cores is allowed, and no core binding (the
    engines' own threads decide), as launch.command('mpirun') does."""
    out = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True, timeout=30)
    return ["--oversubscribe", "--bind-to", "none"] if "Open MPI" in out.stdout + out.stderr else []

