"""The two watchdogs that keep an interactive cluster from outliving its notebook.

A notebook's engines must not keep running, or keep an allocation, after the notebook is
gone. A context manager and a finalizer stop them when the kernel ends normally (cell
error, interrupt, restart, shutdown), but a kernel killed with SIGKILL (a "kernel died",
an out-of-memory kill, a hub culling the server) runs no Python at all. Two processes that
do not die with the kernel cover that case:

* the **reaper** (``python -m guide_utils.cluster.watchdog reaper PID START STATE``) runs on
  the notebook's machine in its own session and checks once a second whether the kernel
  process is still alive. When it is gone, it cancels the engines' Slurm job (``scancel``)
  and ends every process that carries the cluster's id (controller, ``mpiexec``, engines).
  Bound: about one second plus Slurm's ``KillWait`` (the site's; 10 s on the test Slurm).
* the **controller watch** (``... watchdog controller HOST PORT``) runs inside the engines'
  batch job. When the controller stops accepting connections ``misses`` checks in a row
  (``interval`` seconds apart), it cancels its own job: the allocation is given back even if
  the notebook's whole machine went away. Bound: ``interval x misses`` (15 s by default).
  (It checks the port, so it fires when every controller process is gone: the controller's
  scheduler processes inherit the listening socket and keep it open while any of them lives.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

from ..core.paths import pythonpath

CLUSTER_VAR = "IPP_CLUSTER_ID"  # ipyparallel puts it in the environment of everything it starts


def processes_of(cluster_id: str, exclude: Iterable[int] = ()) -> list:
    """Every live process (psutil) whose environment carries this ipyparallel cluster id."""
    import psutil

    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in skip:
            continue
        try:
            if proc.environ().get(CLUSTER_VAR) == cluster_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def end_processes(procs: list, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``grace`` seconds."""
    import psutil

    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def scancel(job_ids: Iterable[str]) -> None:
    for job in job_ids:
        if shutil.which("scancel"):
            subprocess.run(["scancel", str(job)], capture_output=True, timeout=60)


def reap(state: dict) -> None:
    """Cancel the cluster's Slurm jobs, end its processes and remove its private folder."""
    scancel(state.get("jobs", []))
    if state.get("cluster_id"):
        end_processes(processes_of(state["cluster_id"]))
    if state.get("profile_dir"):
        shutil.rmtree(state["profile_dir"], ignore_errors=True)


def _alive(pid: int, started: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        # a recycled pid belongs to another process, started later
        return abs(proc.create_time() - started) < 1 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reaper(pid: int, started: float, state_file: Path, interval: float = 1.0) -> int:
    """Wait for process ``pid`` to end, then reap what ``state_file`` lists. Returns when
    the state file disappears too (the cluster was stopped normally)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook interrupt is not for us
    while state_file.exists():
        if not _alive(pid, started):
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):
                return 0
            reap(state)
            state_file.unlink(missing_ok=True)
            return 0
        time.sleep(interval)
    return 0


def start_reaper(state_file: Path) -> "subprocess.Popen":
    """Start a reaper for this process, in its own session (a kill of the kernel's process
    group does not reach it)."""
    import psutil

    me = psutil.Process()
    cmd = [sys.executable, "-m", "guide_utils.cluster.watchdog", "reaper", str(me.pid), repr(me.create_time()),
           str(state_file)]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": pythonpath()})


def reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def controller_watch(host: str, port: int, *, interval: float = 5.0, misses: int = 3,
                     on_lost: Callable[[], None]) -> None:
    """Call ``on_lost`` once the controller at ``host:port`` has refused ``misses`` checks in a row."""
    missed = 0
    while missed < misses:
        time.sleep(interval)
        missed = 0 if reachable(host, port) else missed + 1
    on_lost()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["reaper"] and len(argv) == 4:
        return reaper(int(argv[1]), float(argv[2]), Path(argv[3]))
    if argv[:1] == ["controller"] and len(argv) in (3, 5):
        interval, misses = (float(argv[3]), int(argv[4])) if len(argv) == 5 else (5.0, 3)
        job = os.environ.get("SLURM_JOB_ID")

        def lost() -> None:
            print(f"== the notebook's controller at {argv[1]}:{argv[2]} is gone: cancelling job {job}", flush=True)
            scancel([job] if job else [])

        controller_watch(argv[1], int(argv[2]), interval=interval, misses=misses, on_lost=lost)
        return 0
    print("usage: python -m guide_utils.cluster.watchdog reaper PID START STATE | controller HOST PORT "
          "[INTERVAL MISSES]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
