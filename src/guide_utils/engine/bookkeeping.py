"""A run's bookkeeping, the same for both engines: the run record, the lines it prints, the
summary at the end, and the digest that shows whether the workers hold the same weights.

Only rank 0 writes and prints; the other ranks hold a :class:`RunBook` that does neither,
so engine code never branches on the rank for bookkeeping.

>>> import numpy as np
>>> weights_digest([("w", np.zeros(3, dtype=np.float32))]) == weights_digest([("w", np.zeros(3, dtype=np.float32))])
True
>>> weights_digest([("w", np.zeros(3, dtype=np.float32))]) == weights_digest([("w", np.ones(3, dtype=np.float32))])
False
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable

from ..core.config import TrainConfig
from .plan import RunPlan, default_run_name


def weights_digest(named_arrays: Iterable[tuple[str, Any]]) -> str:
    """A short hash of named weight arrays (numpy): equal digests mean identical weights.

    Both engines hash their trainable weights only. BatchNorm's running statistics are left
    out on purpose: each worker computes them on its own shard (Horovod never averages them,
    DDP overwrites them from rank 0 before each forward pass), so they differ by design.
    """
    h = hashlib.sha256()
    for name, array in named_arrays:
        h.update(name.encode())
        h.update(array.tobytes())
    return h.hexdigest()[:16]


def environment(dist_kind: str, workers: int, **framework: Any) -> dict[str, Any]:
    """The facts recorded with every run: where it ran, with what, and in which Slurm job.

    ``network`` is what the site profile says of the network between the nodes
    (``GUIDE_NETWORK``, e.g. ``10Gbit/s``; None where it says nothing): no process can measure
    the link it was given, and runs on two networks (the SLICES benchmark's 1 and 10 Gbit/s)
    are otherwise the same runs."""
    env: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(), **framework,
                           "dist": dist_kind, "workers": workers, "network": os.environ.get("GUIDE_NETWORK") or None}
    if dist_kind == "horovod":
        import horovod

        env["horovod"] = horovod.__version__
    env["slurm"] = None
    if os.environ.get("SLURM_JOB_ID"):  # only a job needs the node-list parser (python-hostlist)
        from ..runtime.slurm import SlurmJob

        job = SlurmJob.from_env()
        env["slurm"] = asdict(job) if job else None
    return env


class RunBook:
    """The record (``results_dir/<run name>.jsonl``) and the printed lines of one run.

    ``run_name`` is the name to continue (from a checkpoint) or the user's ``--run-name``;
    ``resume`` appends to that record instead of starting a new one. ``environment`` is
    called on rank 0 only.
    """

    def __init__(self, cfg: TrainConfig, plan: RunPlan, *, framework: str, prefix: str, is_root: bool,
                 data: str, environment: Callable[[], dict], run_name: str | None = None, resume: bool = False,
                 resuming: str = ""):
        from ..core.records import RunRecorder

        self.cfg, self.plan, self.prefix, self.is_root = cfg, plan, prefix, is_root
        self.recorder = self.monitor = None
        self.run_name = run_name
        if not is_root:
            return
        config = {**asdict(cfg), "framework": framework, **plan.record(), "data": data}
        name = run_name or cfg.run_name or default_run_name(cfg, plan.workers, framework)
        self.recorder = RunRecorder(Path(cfg.results_dir), name,
                                    config=config, environment=environment(), resume=resume and run_name is not None)
        self.run_name = self.recorder.run_name
        if not cfg.quiet:
            self.say(f"{data}; model {cfg.model}; {plan.describe()} ({cfg.dist}){resuming}; "
                     f"record {self.recorder.path}")
        if cfg.monitor:
            from .monitor import Monitor

            self.monitor = Monitor(self.recorder.sample, cfg.monitor).start()

    @property
    def record_path(self) -> Path | None:
        return self.recorder.path if self.recorder else None

    def say(self, text: str) -> None:
        """Print one line from rank 0, prefixed like every line of this engine."""
        if self.is_root:
            print(f"{self.prefix} {text}", flush=True)

    def epoch(self, row: dict[str, Any]) -> None:
        """Record a finished epoch and print it as one line (unless ``quiet``)."""
        if not self.recorder:
            return
        self.recorder.epoch(**row)
        if self.cfg.quiet:
            return
        rate = row.get("images_per_second")
        ips = f"{rate:.0f} img/s" if rate else "img/s n/a"
        self.say(f"epoch {row['epoch']}/{self.cfg.epochs}  lr {row['lr']:.4g}  loss {row['loss']:.4f}  "
                 f"train top-1 err {row['train_top1_err']:.2f}%  val top-1 err {row['val_top1_err']:.2f}% "
                 f"top-5 {row['val_top5_err']:.2f}%  {ips}  {row['seconds']:.1f} s")

    def event(self, kind: str, **fields: Any) -> None:
        if self.recorder:
            self.recorder.event(kind, **fields)

    def close(self) -> None:
        """Stop the utilisation sampler (every way out of a run calls this)."""
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None

    def finish(self, *, completed_epochs: int, digests: list[str]) -> None:
        """The summary line. The best validation error covers every epoch of the record, also
        those trained before a resume, so a resumed run's summary means what an unbroken
        run's does."""
        if not self.recorder:
            return
        from ..core.records import epoch_rows

        errors = [row.get("val_top1_err") for row in epoch_rows(self.recorder.path)]
        errors = [e for e in errors if e is not None and not math.isnan(e)]
        self.recorder.summary(completed_epochs=completed_epochs, weights_digests=digests,
                              ranks_agree=len(set(digests)) == 1, best_val_top1_err=min(errors, default=None))
