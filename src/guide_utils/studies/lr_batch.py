"""Learning rate x per-worker batch: which learning rates does each batch train well with?

The linear scaling rule (chapter 5) answers along one line: k times the batch, k times the
learning rate. This study asks a grid. MNIST-1D's small CNN is trained at per-worker batches
of 32, 128 and 512 (one process, so the per-worker batch is the global batch: thesis worker
counts 1, 4 and 16 at laptop scale, as in chapters 4-7), each at 1/4, 1/2, 1 and 2 times the
rule's learning rate for that batch (0.05 x batch / 32), without warmup, with the settings of
the book's methods page otherwise, several seeds each. The baseline is the rule's rate at
batch 32, chapters 4-6's k = 1: the summary gives each cell's median, worst run and how many
runs ended near that baseline (at most half above its median error: ``study.TOLERANCE``), and
for each batch the factor with the lowest median. Where that factor stays at 1 the rule holds
on this problem; where it falls as the batch grows, the rule's rate is too high to start from,
the problem warmup addresses (chapter 6).

``python -m guide_utils lr-batch run --jobs 2 --out FILE.csv`` trains every cell (36 runs with
three seeds at one thread, each a run of the quality sweep's length; ``--dry-run`` lists
them), ``summary FILE.csv`` reads a CSV back. No result of it is recorded: the book states
none of its numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from ..core.errors import GuideError
from . import study
from .experiment_plans import SMOKE_BATCH as BASE_BATCH
from .experiment_plans import SMOKE_QUALITY

SETTINGS = {**SMOKE_QUALITY, "lr_scaling": "linear", "warmup": "none", "progress": False, "quiet": True}
BATCHES = (32, 128, 512)
FACTORS = (0.25, 0.5, 1.0, 2.0)  # times the linear rule's learning rate for the batch
SEEDS = (0, 1, 2)
THREADS = (1,)
KEY = ("per_worker_batch", "lr_factor", "seed", "threads")
COLUMNS = (*KEY, "global_batch", "peak_lr", "best_val_top1_err", "final_val_top1_err", "seconds")


@dataclass(frozen=True)
class Point:
    per_worker_batch: int
    lr_factor: float  # the learning rate in multiples of the linear rule's for this batch
    seed: int

    def key(self) -> dict:
        return asdict(self)

    def config(self, **overrides):
        """The ``TrainConfig`` of this cell: the linear rule's rate from ``base_lr`` x ``lr_factor`` at batch 32."""
        name = f"lr-batch-b{self.per_worker_batch}-x{self.lr_factor:g}-seed{self.seed}"
        settings = {**SETTINGS, "per_worker_batch": self.per_worker_batch, "seed": self.seed, "run_name": name,
                    "base_lr": SETTINGS["base_lr"] * self.lr_factor, **overrides}
        return study.smoke_config(settings, {"lr_batch": self.key()})


def points(batches: Iterable[int] = BATCHES, factors: Iterable[float] = FACTORS,
           seeds: Iterable[int] = SEEDS) -> list[Point]:
    """Every (batch, factor) cell with every seed, the baseline cell (batch 32, factor 1) always among them."""
    batches, factors, seeds = list(batches), list(factors), list(seeds)
    if any(b < 1 for b in batches) or any(f <= 0 for f in factors):
        raise GuideError(f"--batches must be 1 or more and --factors more than 0, got {batches} and {factors}")
    cells = dict.fromkeys([(BASE_BATCH, 1.0), *((b, float(f)) for b in batches for f in factors)])
    return [Point(b, f, s) for b, f in cells for s in seeds]


def row(point: Point, cfg, result) -> dict:
    """A trained cell's row (``COLUMNS``; the study adds ``threads``)."""
    return {**point.key(), **study.quality(cfg, result)}


def describe(row: dict) -> str:
    return (f"b={row['per_worker_batch']} x{row['lr_factor']:g} seed {row['seed']} x{row['threads']}: "
            f"{row['best_val_top1_err']:.2f} %")


def best_factors(outcomes) -> dict[int, float]:
    """For each batch of ``outcomes`` (``STUDY.outcomes``), the factor with the lowest median error."""
    best = outcomes.loc[outcomes.groupby("per_worker_batch")["median"].idxmin()]
    return {int(b): float(f) for b, f in zip(best["per_worker_batch"], best["lr_factor"])}


def summary(table) -> str:
    outcomes = STUDY.outcomes(table)
    best = ", ".join(f"{b}: x{f:g} (lr {SETTINGS['base_lr'] * f * b / BASE_BATCH:g})"
                     for b, f in best_factors(outcomes).items())
    return f"{STUDY.format(outcomes)}\nlowest median per batch: {best}"


def arguments(run) -> None:
    study.add_list_argument(run, "--batches", BATCHES, "per-worker batches (one process: the global batch)")
    study.add_list_argument(run, "--factors", FACTORS, "learning rates in multiples of the linear rule's", float)
    study.add_list_argument(run, "--seeds", SEEDS, "seeds per cell")


STUDY = study.Study("lr-batch", "MNIST-1D learning rate x per-worker batch", "python -m guide_utils lr-batch run",
                    COLUMNS, KEY, row, threads=THREADS, summary=summary, describe=describe,
                    reference=(("per_worker_batch", BASE_BATCH), ("lr_factor", 1.0)),
                    help="which learning rates each per-worker batch trains well with: the linear rule as a grid",
                    arguments=arguments, plan=lambda args: points(args.batches, args.factors, args.seeds))
