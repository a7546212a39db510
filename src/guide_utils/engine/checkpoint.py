"""Checkpoints that survive preemption: atomic writes, the newest K kept, corrupt ones skipped.

Slurm kills a job at its time limit, possibly in the middle of a write. So a checkpoint is
written to a temporary file in the same directory, flushed to disk, and renamed into place
(atomic on POSIX): a reader sees either the old set of checkpoints or the new one, never a
half-written file under a checkpoint's name. Loading uses ``weights_only=True``, which
refuses to run code hidden in a pickle; every piece of state is therefore stored as
tensors, numbers, strings, lists and dicts (see :func:`rng_state`).

Names: ``checkpoint-epoch0010.pt`` after 10 complete epochs, and
``checkpoint-epoch0010-step0000420.pt`` when stopped at step 420 of the 11th epoch.
"""

from __future__ import annotations

import os
import random
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import GuideError

_NAME = re.compile(r"^checkpoint-epoch(?P<epoch>\d{4,})(?:-step(?P<step>\d{7,}))?\.pt$")


@dataclass
class LoadedCheckpoint:
    path: Path
    state: dict[str, Any]
    epoch: int
    step: int


def _name(epoch: int, step: int | None) -> str:
    return f"checkpoint-epoch{epoch:04d}" + (f"-step{step:07d}" if step else "") + ".pt"


def checkpoints(directory: Path) -> list[tuple[int, int, Path]]:
    """``(epoch, step, path)`` of our checkpoints, newest first (by name, not by mtime)."""
    found = []
    for p in Path(directory).iterdir() if Path(directory).is_dir() else []:
        m = _NAME.match(p.name)
        if m and p.is_file():
            found.append((int(m["epoch"]), int(m["step"] or 0), p))
    return sorted(found, key=lambda t: (t[0], t[1]), reverse=True)


def ensure_writable(directory: Path) -> Path:
    """Create ``directory`` if needed and prove it is writable, or raise GuideError."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise GuideError(f"checkpoint directory {directory} is not writable ({exc.strerror or exc}); "
                         "choose another --checkpoint-dir") from None
    return directory


def save(directory: Path, state: dict[str, Any], *, epoch: int, step: int | None = None, keep: int = 3) -> Path:
    """Write ``state`` atomically as the checkpoint for (epoch, step); keep the newest ``keep``."""
    import torch

    directory = Path(directory)
    final = directory / _name(epoch, step)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    for _, _, old in checkpoints(directory)[keep:]:
        old.unlink(missing_ok=True)
    for stale in directory.glob(".checkpoint-epoch*.tmp"):  # left by a process killed mid-write
        if stale.stat().st_mtime < final.stat().st_mtime:
            stale.unlink(missing_ok=True)
    return final


def load_latest(directory: Path, *, expect: dict[str, Any] | None = None,
                map_location: str = "cpu") -> LoadedCheckpoint | None:
    """The newest readable checkpoint in ``directory`` (None if there is none).

    An unreadable newest file is reported and the previous one used; the files themselves
    are never deleted. ``expect`` is compared with the checkpoint's ``meta`` dict.
    """
    import torch

    found = checkpoints(Path(directory))
    if not found:
        return None
    skipped: list[str] = []
    reasons = ""
    for epoch, step, path in found:
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
            if not isinstance(state, dict) or "model" not in state:
                raise ValueError("not a guide_utils checkpoint")
        except Exception as exc:  # noqa: BLE001 - truncated, corrupt or foreign files alike
            skipped.append(path.name)
            reasons = f"{type(exc).__name__}: truncated or corrupt"
            continue
        for name in skipped:  # one line each, only when an older checkpoint saves the day
            message = f"checkpoint {name} is unreadable ({reasons}); using {path.name} instead"
            print(f"warning: {message}", file=sys.stderr)
        meta = state.get("meta", {})
        for key, want in (expect or {}).items():
            if key in meta and meta[key] != want:
                raise GuideError(f"checkpoint {path} was written for {key}={meta[key]}, this run has {key}={want}; "
                                 "use a fresh --checkpoint-dir or the same settings")
        return LoadedCheckpoint(path, state, epoch, step)
    raise GuideError(f"no readable checkpoint in {directory}: {', '.join(skipped)} truncated or corrupt; "
                     "move them aside or point --checkpoint-dir elsewhere")


def rng_state() -> dict[str, Any]:
    """Every random generator training touches, in types ``torch.load(weights_only=True)`` accepts."""
    import numpy as np
    import torch

    version, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"version": version, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["version"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
