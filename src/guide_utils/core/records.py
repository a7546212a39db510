"""Run records: one JSON-lines file per run, written as training goes, read back as tables.

Each line is one JSON object with a ``type``: ``config`` (first), ``environment``, one
``epoch`` per finished epoch, ``resume`` when a preempted run continues, ``event``-like
lines (``preempted``), ``sample`` lines of utilisation over time (``--monitor``), and
``summary`` at the end. Every line is written whole and flushed
to disk, so a run killed at any moment leaves a readable record.

>>> import tempfile; d = Path(tempfile.mkdtemp())
>>> r = RunRecorder(d, "demo", config={"model": "mnist1d_cnn", "workers": 2})
>>> r.epoch(epoch=1, val_top1_err=12.5, images_per_second=900.0, seconds=3.0)
>>> read_run(r.path).epochs["val_top1_err"].tolist()
[12.5]
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .errors import GuideError

TABLE_CONFIG = ["model", "data", "dist", "workers", "per_worker_batch", "global_batch", "optimizer", "lr_scaling",
                "warmup", "warmup_epochs", "epochs"]


def _plain(value: Any) -> Any:
    """JSON-safe: numpy/torch scalars to numbers, tuples to lists, paths to strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


class RunRecorder:
    """Appends a run's record to ``results_dir/<run_name>.jsonl``; never overwrites a file."""

    def __init__(self, results_dir: Path, run_name: str, *, config: dict, environment: dict | None = None,
                 resume: bool = False):
        results_dir = Path(results_dir)
        try:
            results_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GuideError(f"cannot create results directory {results_dir} ({exc.strerror or exc}); "
                             "choose another --results-dir") from None
        path = results_dir / f"{run_name}.jsonl"
        if resume and path.exists():
            self.path, self.run_name = path, run_name
            self._write({"type": "resume", "time": self._now()})
            return
        n = 1
        while True:  # someone's earlier run keeps its file: take the next free name
            try:
                # Exclusive create: two jobs of an array starting at once cannot both take a name.
                with open(path, "x", encoding="utf-8"):
                    break
            except FileExistsError:
                n += 1
                path = results_dir / f"{run_name}-{n}.jsonl"
        self.path, self.run_name = path, path.stem
        self._write({"type": "config", "run": self.run_name, "time": self._now(), "config": config})
        if environment is not None:
            self._write({"type": "environment", "environment": environment})

    @staticmethod
    def _now() -> str:
        return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    _lock = threading.Lock()  # the monitor writes from its own thread

    def _write(self, obj: dict) -> None:
        line = json.dumps(_plain(obj)) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def epoch(self, **fields: Any) -> None:
        self._write({"type": "epoch", **fields})

    def event(self, kind: str, **fields: Any) -> None:
        self._write({"type": kind, "time": self._now(), **fields})

    def sample(self, fields: dict[str, Any]) -> None:
        """One utilisation sample (``engine.monitor``)."""
        self._write({"type": "sample", **fields})

    def summary(self, **fields: Any) -> None:
        self._write({"type": "summary", "time": self._now(), **fields})


@dataclass
class RunRecord:
    """A run record read back: its settings, environment, epochs (a table), samples, summary."""

    name: str
    path: Path
    config: dict
    environment: dict | None
    epochs: Any  # pandas.DataFrame
    summary: dict | None
    events: list[dict] = field(default_factory=list)
    skipped_lines: int = 0
    samples: Any = None  # pandas.DataFrame of utilisation samples (--monitor); empty without


def _parse(path: Path | str) -> dict[str, Any]:
    """A run record's lines by kind, with json alone (no pandas: a training process reads its
    own record at the end, and importing pandas costs it most of a CPU-second)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run record {path} does not exist")
    config = environment = summary = None
    epochs: dict[int, dict] = {}
    events, samples, skipped = [], [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            kind = obj["type"]
        except (json.JSONDecodeError, KeyError, TypeError):
            skipped += 1
            continue
        if kind == "config":
            config = obj.get("config", {})
        elif kind == "environment":
            environment = obj.get("environment")
        elif kind == "epoch":
            epochs[obj.get("epoch", len(epochs) + 1)] = {k: v for k, v in obj.items() if k != "type"}
        elif kind == "summary":
            summary = obj
        elif kind == "sample":
            samples.append({k: v for k, v in obj.items() if k != "type"})
        else:
            events.append(obj)
    if config is None:
        raise GuideError(f"{path} is not a run record (no config line); run records are written by "
                         "python -m guide_utils.train")
    # A resumed run re-records epochs it redid: the last occurrence wins.
    return {"path": path, "config": config, "environment": environment, "summary": summary,
            "epochs": [epochs[k] for k in sorted(epochs)], "events": events, "samples": samples, "skipped": skipped}


def epoch_rows(path: Path | str) -> list[dict]:
    """A run record's epochs, one dict each in epoch order (a redone epoch's last record)."""
    return _parse(path)["epochs"]


def read_run(path: Path | str) -> RunRecord:
    """One run record; malformed lines (e.g. a truncated last line) are skipped and counted."""
    import pandas as pd

    r = _parse(path)
    return RunRecord(r["path"].stem, r["path"], r["config"], r["environment"], pd.DataFrame(r["epochs"]),
                     r["summary"], r["events"], r["skipped"], pd.DataFrame(r["samples"]))


def read_runs(results_dir: Path | str, pattern: str = "*.jsonl") -> list[RunRecord]:
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise GuideError(f"results directory {results_dir} does not exist; run python -m guide_utils.train first")
    return [read_run(p) for p in sorted(results_dir.glob(pattern))]


def _column(table, name: str):
    import pandas as pd

    return table[name].dropna() if name in table else pd.Series(dtype=float)


def runs_table(runs: Iterable[RunRecord] | Path | str):
    """One row per run: its settings and its best/final errors and mean throughput."""
    import pandas as pd

    if isinstance(runs, (str, Path)):
        runs = read_runs(runs)
    rows = []
    for run in runs:
        row = {"run": run.name, **{k: run.config.get(k) for k in TABLE_CONFIG}}
        e = run.epochs
        top1 = _column(e, "val_top1_err")
        row.update(epochs_done=len(e), best_val_top1_err=top1.min(),
                   final_val_top1_err=top1.iloc[-1] if len(top1) else None,
                   best_val_top5_err=_column(e, "val_top5_err").min(),
                   mean_images_per_second=_column(e, "images_per_second").mean(),
                   total_seconds=_column(e, "seconds").sum())
        rows.append(row)
    return pd.DataFrame(rows)
