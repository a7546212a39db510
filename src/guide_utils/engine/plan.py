"""The run plan: what a data-parallel run will do, decided once from the settings and the
world it starts in. The PyTorch engine and the TensorFlow door both train by it, so a
setting means the same thing in both.

>>> from guide_utils.core.config import make_config
>>> plan = RunPlan.make(make_config("full", warmup="gradual"), workers=32, samples_per_worker=40_036)
>>> (plan.global_batch, plan.peak_lr, plan.steps_per_epoch)
(4096, 1.6, 312)
>>> round(plan.lr_at(0.0), 3), round(plan.lr_at(5.0), 3)
(0.05, 1.6)
>>> plan.describe()
'32 worker(s) x 128 = global batch 4096; peak lr 1.6 (linear rule), warmup gradual 5 epochs'

Sixteen workers that each add two batches' gradients before a step (``--accumulate-steps 2``)
keep that global batch, its learning rate and its steps per epoch (each worker sees twice the
samples, in twice the batches):

>>> half = RunPlan.make(make_config("full", warmup="gradual", accumulate_steps=2), workers=16,
...                     samples_per_worker=80_072)
>>> (half.global_batch, half.peak_lr, half.steps_per_epoch, half.lr_at(0.0) == plan.lr_at(0.0))
(4096, 1.6, 312, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..core.errors import GuideError
from ..core.scaling import global_batch, scaled_lr
from ..core.schedules import lr_at


@dataclass(frozen=True)
class RunPlan:
    workers: int
    per_worker_batch: int
    global_batch: int
    lr_scaling: str
    peak_lr: float
    steps_per_epoch: int
    epochs: int
    schedule: dict[str, Any]  # the keyword arguments of schedules.lr_at
    # micro-batches per optimizer step on each worker; steps_per_epoch counts optimizer steps
    accumulate_steps: int = 1

    @property
    def samples_per_step(self) -> int:
        """Samples one worker consumes per optimizer step (its share of the global batch)."""
        return self.per_worker_batch * self.accumulate_steps

    @classmethod
    def make(cls, cfg: TrainConfig, *, workers: int, samples_per_worker: int, data_name: str = "the dataset",
             local_batch: int | None = None) -> "RunPlan":
        """The plan for ``workers`` processes that each see ``samples_per_worker`` samples per
        epoch in batches of ``local_batch`` (default: the per-worker batch; TensorFlow's
        MultiWorkerMirroredStrategy feeds the global batch and splits it itself), adding the
        gradients of ``cfg.accumulate_steps`` batches before each optimizer step.

        The global batch, the learning rate the scaling rule gives it and the schedule all count
        optimizer steps: ``steps_per_epoch`` is the number of optimizer steps, and gradual warmup
        starts at the rate of one worker's micro-batch (``--per-worker-batch``) whatever the
        accumulation, so 4 workers x b and 2 workers x b x 2 follow one schedule."""
        n = cfg.accumulate_steps
        gbatch = global_batch(cfg.per_worker_batch, workers) * n
        peak = scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling)
        local = local_batch or cfg.per_worker_batch
        steps = samples_per_worker // (local * n)
        if steps == 0:
            per_step = f"one batch of {local}" if n == 1 else f"one optimizer step of {n} x {local} = {n * local}"
            raise GuideError(f"{data_name}: each of {workers} worker(s) gets {samples_per_worker} samples, fewer than "
                             f"{per_step} (--per-worker-batch {cfg.per_worker_batch}"
                             + (f" --accumulate-steps {n}" if n > 1 else "") + "); use a smaller batch"
                             + (", fewer accumulation steps" if n > 1 else "") + " or fewer workers")
        if cfg.max_steps_per_epoch:
            steps = min(steps, cfg.max_steps_per_epoch)
        schedule = {"peak_lr": peak, "warmup": cfg.warmup, "warmup_epochs": cfg.warmup_epochs,
                    # Gradual warmup starts from one worker's learning rate (thesis, Appendix 13).
                    "warmup_start_lr": cfg.warmup_start_lr() if cfg.warmup == "gradual" else None,
                    "milestones": tuple(cfg.milestones), "gamma": cfg.gamma}
        lr_at(0.0, **schedule)  # an impossible schedule fails here, before any work
        return cls(workers, cfg.per_worker_batch, gbatch, cfg.lr_scaling, peak, steps, cfg.epochs, schedule, n)

    def check_ranks_agree(self, allgather_object) -> None:
        """Fail on every rank, before the first step, if the ranks planned different numbers of
        steps per epoch (each computes its own from the data it sees). Otherwise the rank that
        finishes an epoch first moves on to its next collective while the others still wait for
        its gradients: a job that hangs until the backend's timeout, or for ever.

        ``allgather_object`` is the backend's (``Dist.allgather_object``): every rank's value.
        """
        steps = allgather_object(self.steps_per_epoch)
        if len(set(steps)) > 1:
            per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
            raise GuideError(f"the ranks planned different numbers of steps per epoch ({per_rank}), so they would "
                             "wait for each other's gradients for ever; every rank must see the same data (the same "
                             "--data with a complete copy on every node, the same --mnist1d-samples and "
                             "--max-steps-per-epoch)")

    def lr_at(self, epoch: float) -> float:
        """The learning rate at (fractional) ``epoch``."""
        return lr_at(epoch, **self.schedule)

    def describe(self) -> str:
        warmup = self.schedule["warmup"]
        if warmup != "none":
            warmup += f" {self.schedule['warmup_epochs']} epochs"
        accumulate = f" x {self.accumulate_steps} accumulation steps" if self.accumulate_steps > 1 else ""
        return (f"{self.workers} worker(s) x {self.per_worker_batch}{accumulate} = global batch {self.global_batch}; "
                f"peak lr {self.peak_lr:g} ({self.lr_scaling} rule), warmup {warmup}")

    def record(self) -> dict[str, Any]:
        """What the run record keeps of the plan (beside the settings themselves)."""
        return {"workers": self.workers, "global_batch": self.global_batch, "peak_lr": self.peak_lr,
                "steps_per_epoch": self.steps_per_epoch}


def keep_global_batch(global_batch: int, workers: int, per_worker_batch: int) -> str:
    """How ``workers`` workers get back to ``global_batch`` (for an error message).

    >>> keep_global_batch(128, 2, 32)
    'keep the global batch with --accumulate-steps 2'
    >>> keep_global_batch(128, 2, 48)
    'keep the global batch with --per-worker-batch 64 (or --per-worker-batch 32 --accumulate-steps 2)'
    >>> keep_global_batch(128, 3, 32)
    'no split of global batch 128 over 3 workers is whole: use a worker count that divides 128'
    """
    if global_batch % (workers * per_worker_batch) == 0:
        return f"keep the global batch with --accumulate-steps {global_batch // (workers * per_worker_batch)}"
    if global_batch % workers == 0:
        share = global_batch // workers
        half = f" (or --per-worker-batch {share // 2} --accumulate-steps 2)" if share % 2 == 0 else ""
        return f"keep the global batch with --per-worker-batch {share}{half}"
    return (f"no split of global batch {global_batch} over {workers} workers is whole: use a worker count that "
            f"divides {global_batch}")


def default_run_name(cfg: TrainConfig, workers: int, framework: str = "pytorch") -> str:
    """A record name that says what ran, e.g. ``mnist1d_cnn-mnist1d-horovod-2x32-linear-gradual1-seed0``."""
    warmup = cfg.warmup + (str(cfg.warmup_epochs) if cfg.warmup != "none" else "")
    batch = f"{workers}x{cfg.per_worker_batch}" + (f"x{cfg.accumulate_steps}" if cfg.accumulate_steps > 1 else "")
    name = f"{cfg.model}-{Path(cfg.data).name}-{cfg.dist}-{batch}-{cfg.lr_scaling}-{warmup}"
    return ("tf-" if framework == "tensorflow" else "") + f"{name}-seed{cfg.seed}"
