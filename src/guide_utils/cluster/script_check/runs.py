"""Start the reader's script under a launcher with the probe in every worker, watch it, and
read back what each rank recorded.

A run starts in a folder of its own, so that a checkpoint the script writes to a relative
path is found by its own restart and by nothing else. The check waits for the first
training forward pass at most ``timeout`` seconds, and afterwards for any rank's next event
as long; once a rank has ended, the others get a quarter of that (at least 10 s) to end too.
A run that overstays is stopped, with every process it started, and says why.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...runtime.launch import BIN
from ...runtime.launch import command as launcher_command

PROBE = "guide_utils.cluster.script_check.probe"
# What the workers must not inherit: they run on this machine, ranked by the launcher alone.
FOREIGN = ("SLURM_", "PMI_", "PMIX_", "OMPI_COMM_WORLD_", "HOROVOD_")
FOREIGN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Rank:
    rank: int
    events: list[dict]
    log: str

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["e"] == kind]

    @property
    def end(self) -> dict | None:
        ends = self.of("end")
        return ends[-1] if ends else None

    @property
    def last_position(self) -> int:
        return max((e.get("pos", 0) for e in self.events if "pos" in e), default=0)

    def tail(self, lines: int = 6) -> str:
        """The last lines the rank printed, without progress bars' carriage returns."""
        text = [re.sub(r"^\[rank\d+\]:", "", line.rsplit("\r", 1)[-1]) for line in self.log.splitlines()
                if line.strip()]
        return "\n".join(text[-lines:])


@dataclass
class Run:
    name: str
    folder: Path  # where the probe wrote its files
    ranks: dict[int, Rank]
    seconds: float
    returncode: int | None
    output: str  # the launcher's own
    stopped: str | None = None  # why the check ended the run, if it did
    settings: dict = field(default_factory=dict)

    def first(self, kind: str) -> dict | None:
        found = [e for r in self.ranks.values() for e in r.of(kind)]
        return min(found, key=lambda e: e["t"]) if found else None

    def weights(self, rank: int, which: str = "final", part: str = "params") -> list[dict] | None:
        """A rank's models' parameters (or buffers) by name, at its first training pass or its end."""
        import torch

        path = self.folder / f"{self.name}.rank{rank}.{which}.pt"
        return [m[part] for m in torch.load(path, weights_only=True)] if path.exists() else None


def environment(folder: Path, name: str, settings: dict) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(FOREIGN) and k not in FOREIGN_NAMES}
    env.update(PYTHONUNBUFFERED="1", GUIDE_CHECK_DIR=str(folder), GUIDE_CHECK_RUN=name)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default; horovodrun sets none
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update({f"GUIDE_CHECK_{k.upper()}": str(v) for k, v in settings.items() if v is not None})
    return env


def read(folder: Path, name: str, workers: int) -> dict[int, Rank]:
    ranks = {}
    for rank in range(workers):
        events_file, log_file = folder / f"{name}.rank{rank}.jsonl", folder / f"{name}.rank{rank}.log"
        events = []
        if events_file.exists():
            for line in events_file.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:  # the last line of a rank killed mid-write
                    pass
        log = log_file.read_text(errors="replace") if log_file.exists() else ""
        ranks[rank] = Rank(rank, events, log)
    return ranks


def _sizes(folder: Path, name: str) -> tuple[int, bool, bool]:
    """(bytes recorded so far, whether a training pass was recorded, whether a rank ended)."""
    total, trained, ended = 0, False, False
    for path in folder.glob(f"{name}.rank*.jsonl"):
        text = path.read_bytes()
        total += len(text)
        trained = trained or b'"e": "fwd"' in text
        ended = ended or b'"e": "end"' in text
    return total, trained, ended


def _stop(proc: subprocess.Popen) -> None:
    """End the launcher and every process below it (torchrun's workers are not in its group)."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in family:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        if not psutil.wait_procs(family, timeout=5)[1]:
            break
    proc.wait()


def _watch(proc: subprocess.Popen, folder: Path, name: str, timeout: float, progress) -> str | None:
    """Wait for the run; return why it had to be stopped, or None if it ended by itself."""
    start = last_change = time.monotonic()
    seen, trained_at, ended_at = -1, None, None
    while proc.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        size, trained, ended = _sizes(folder, name)
        if size != seen:
            seen, last_change = size, now
            if progress is not None:
                progress(folder, name)
        trained_at = trained_at or (now if trained else None)
        ended_at = ended_at or (now if ended else None)
        if trained_at is None and now - start > timeout:
            return f"no rank reached a training forward pass within {timeout:.0f} s"
        if trained_at is not None and now - last_change > timeout:
            return f"no rank recorded anything for {timeout:.0f} s (a hang)"
        if ended_at is not None and now - max(ended_at, last_change) > max(10.0, timeout / 4):
            return "a rank ended and the others hung"
    return None


def launch(launcher: str, workers: int, script: Path, args: list[str], folder: Path, name: str,
           cwd: Path, settings: dict, timeout: float, progress=None, checked: bool = False) -> Run:
    """One run of the script, in ``cwd``, its records in ``folder`` under ``name``. ``checked``:
    an earlier run's launcher started this Horovod, so horovodrun skips its build check."""
    cwd.mkdir(parents=True, exist_ok=True)
    out_path = folder / f"{name}.launcher.log"
    start = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(launcher_command(launcher, workers, PROBE, [str(script), *args], checked=checked),
                                cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=environment(folder, name, settings), start_new_session=True)
        try:
            stopped = _watch(proc, folder, name, timeout, progress)
        finally:
            if proc.poll() is None:
                _stop(proc)
    return Run(name, folder, read(folder, name, workers), time.monotonic() - start, proc.returncode,
               out_path.read_text(errors="replace"), stopped, settings)
