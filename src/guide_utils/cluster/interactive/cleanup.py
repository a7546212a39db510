"""What a running interactive cluster holds, and letting go of all of it.

The finalizer of an ``EngineCluster`` gets a :class:`Resources`, never the cluster itself
(which it would keep alive); :func:`cleanup` stops the client, the controller, the engines
and their Slurm job, and is safe to call twice, at exit or after a failed start. The state
file is what the reaper (``cluster.watchdog``) watches: gone, the reaper exits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import watchdog


@dataclass
class Resources:
    """What a running cluster holds; the finalizer gets this, never the EngineCluster."""

    cluster_id: str
    profile_dir: str
    state_file: Path
    cluster: Any = None
    client: Any = None
    jobs: list[str] = field(default_factory=list)
    reaper: Any = None

    def save(self) -> None:
        # whole or not at all: a kernel killed while writing must not leave the reaper a
        # half file it cannot read (it would then cancel nothing)
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps({"cluster_id": self.cluster_id, "jobs": self.jobs,
                                   "profile_dir": self.profile_dir}))
        os.replace(tmp, self.state_file)


def cleanup(res: Resources) -> None:
    """Stop everything ``res`` holds; safe to call twice, at exit, or after a failed start."""
    if res.client is not None:
        try:
            res.client.close()
        except Exception:  # noqa: BLE001 - clean-up goes on whatever happened
            pass
        res.client = None
    if res.cluster is not None:
        try:
            res.cluster.stop_cluster_sync()
        except Exception:  # noqa: BLE001
            pass
        res.cluster = None
    watchdog.reap({"cluster_id": res.cluster_id, "jobs": res.jobs})
    _wait_jobs_gone(res.jobs)
    res.state_file.unlink(missing_ok=True)  # the reaper sees it gone and exits
    shutil.rmtree(res.profile_dir, ignore_errors=True)


def job_state(job_id: str) -> str | None:
    """The Slurm job's state as squeue shows it, or None once it has left the queue."""
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=60)
    state = out.stdout.strip()
    return None if out.returncode != 0 or state in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT") else state


def queue_info(job_id: str) -> tuple[str, str, str] | None:
    """(state, reason, expected start) of a job as squeue shows them, or None once it has
    left the queue. The reason is Slurm's for a pending job (Priority, Resources,
    JobHeldUser, ...; "None" once it runs); the expected start is the scheduler's estimate
    (what ``squeue --start`` shows; "N/A" when it has none)."""
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%S"], capture_output=True, text=True,
                         timeout=60)
    fields = out.stdout.strip().split("|")
    if out.returncode != 0 or len(fields) != 3 or fields[0] in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"):
        return None
    return fields[0], fields[1], fields[2]


def _wait_jobs_gone(jobs: list[str], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while jobs and shutil.which("squeue") and time.monotonic() < end:
        if all(job_state(j) is None for j in jobs):
            return
        time.sleep(0.5)

