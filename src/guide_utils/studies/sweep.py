"""The quality sweep: does the thesis's large-batch pattern appear at laptop scale?

For each scaling factor k (global batch k x 32) it trains MNIST-1D's small CNN three ways,
several seeds each, and compares with the small-batch baseline (k = 1):

* ``naive``: the learning rate of the baseline, unchanged (thesis experiment 4);
* ``linear``: the linear scaling rule, lr x k, no warmup (experiment 5);
* ``linear+warmup``: the rule plus a gradual warmup (experiments 8 and 9).

A thesis worker count k is emulated by one process with the global batch (see
``guide_utils.studies.experiments``). Settings follow the book's methods page, "Methods: the
laptop scale" (``book/methods.md``): 20,000 samples, 20 epochs, base lr 0.05 at batch 32,
drops at 50 % and 75 % of training, 5 warmup epochs. Quality is the best top-1 validation
error over the epochs, as the thesis reports it.

``python -m guide_utils sweep run --jobs 2 --out FILE.csv`` trains every point with ten
seeds at one CPU thread (``--seeds``, ``--threads``), writes one run record per run and
appends its row to the CSV as it finishes (``--resume`` finishes an interrupted file, or adds
the seeds it lacks); ``summary FILE.csv`` prints each point's median, worst run and how many
runs ended near the baseline (no worse than its worst run: ``draws.tolerance``). Each seed is
one draw: the same seed at another thread count starts from the same weights and sees the
same data in the same order, so it is not another draw, and the record holds each seed once
(``draws``). The thread count is recorded with every run because near the edge of stability
the order of floating-point sums decides some runs (see ``studies.workers``); the ``seconds``
column records each run's wall time under whatever else the machine was doing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..core.paths import packaged
from .experiment_plans import SMOKE_BATCH as BASE_BATCH
from .experiment_plans import SMOKE_QUALITY
from . import study, workers

PROG = "python -m guide_utils sweep"
# The experiments' smoke quality settings (experiment_plans): a sweep point is a smoke run of chapters 4-6.
SETTINGS = {**SMOKE_QUALITY, "progress": False, "quiet": True}
METHODS = {"naive": {"lr_scaling": "none", "warmup": "none"},
           "linear": {"lr_scaling": "linear", "warmup": "none"},
           # gradual warmup from the k = 1 learning rate, as from one GPU's in the thesis
           "linear+warmup": {"lr_scaling": "linear", "warmup": "gradual", "warmup_epochs": 5,
                             "warmup_start_batch": BASE_BATCH}}
KS = (4, 8, 16, 32)
SEEDS = tuple(range(10))  # ten draws per point
THREADS = (1,)
KEY = ["k", "method", "seed", "threads"]  # what identifies a run in the CSV
COLUMNS = ["k", "method", "seed", "threads", "global_batch", "peak_lr", "best_val_top1_err", "final_val_top1_err",
           "seconds"]


@dataclass(frozen=True)
class Point:
    k: int
    method: str  # "baseline" for k = 1
    seed: int

    @property
    def name(self) -> str:
        return f"sweep-k{self.k}-{self.method.replace('+', '-')}-seed{self.seed}"

    def key(self) -> dict:
        return {"k": self.k, "method": self.method, "seed": self.seed}

    def settings(self, **overrides) -> dict:
        method = METHODS["linear"] if self.method == "baseline" else METHODS[self.method]
        return {**SETTINGS, **method, "per_worker_batch": BASE_BATCH * self.k, "seed": self.seed,
                "run_name": self.name, **overrides}

    def config(self, **overrides):
        """The ``TrainConfig`` of this point (the smoke profile and ``settings``), labelled as the sweep's."""
        return study.smoke_config(self.settings(**overrides), {"sweep": self.key()})


def points(ks: Iterable[int] = KS, seeds: Iterable[int] = SEEDS, methods: Iterable[str] = tuple(METHODS),
           baseline: bool = True) -> list[Point]:
    ks, seeds, methods = list(ks), list(seeds), list(methods)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise GuideError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    if any(k < 2 for k in ks):
        raise GuideError(f"--ks must be 2 or more (k = 1 is the baseline, always included), got {ks}")
    out = [Point(1, "baseline", s) for s in seeds] if baseline else []
    return out + [Point(k, m, s) for k in ks for m in methods for s in seeds]


def row(point: Point, cfg, result) -> dict:
    """A trained point's row of the results table (``COLUMNS``; the study adds ``threads``)."""
    return {**point.key(), **study.quality(cfg, result)}


def describe(row: dict) -> str:
    return f"k={row['k']} {row['method']} seed {row['seed']} x{row['threads']}: {row['best_val_top1_err']:.2f} %"


STUDY = study.Study("sweep", "MNIST-1D quality sweep", f"{PROG} run", tuple(COLUMNS), tuple(KEY), row,
                    threads=THREADS, describe=describe, order=("baseline", *METHODS), by=("k", "method"),
                    reference=study.BASELINE, help="the quality sweep over the scaling factor k")
# Per point: runs, median, best, worst, and how many runs ended near the baseline (``study.outcomes``;
# ``by=`` groups by other columns, ``threads`` among them); the summary's lines of such a table.
outcomes, format_outcomes = STUDY.outcomes, STUDY.format


def run_point(point: Point, results_dir: str | Path, **overrides) -> dict:
    """Train one point through the engine in this process; returns its row of the results table."""
    return workers.train_point(point, row, results_dir=str(results_dir), **overrides)


def run(pts: list[Point], results_dir: str | Path, out: str | Path | None = None, *,
        threads: Sequence[int] = THREADS, jobs: int = 1, resume: bool = False, command: str | None = None,
        progress: bool = True, title: str | None = None, overrides: dict | None = None):
    """Train every point at every thread count (``jobs`` cores busy), appending rows to ``out``
    as they finish; with ``resume`` the runs ``out`` already holds are skipped. Returns the
    table of this call's runs (all of ``out`` when it was given). ``overrides`` change the
    settings of every run (tests shrink the problem with them)."""
    return STUDY.run(pts, out, threads=threads, jobs=jobs, resume=resume, command=command, title=title,
                     progress=progress, overrides={"results_dir": str(results_dir), **(overrides or {})})


def load(path: str | Path):
    """A sweep CSV written by ``run``; ``.attrs['source']`` keeps its first line (date, hardware)."""
    return STUDY.load(path)


RECORDED = "quality_sweep_mnist1d.csv"
OTHER_THREADS = "quality_sweep_mnist1d_2threads.csv"


def recorded():
    """The sweep this guide's book shows, ten seeds per point, each once, committed with the
    provenance line of each session that trained some of them (``.attrs['sources']``)."""
    return load(packaged("results", "recorded", RECORDED))


def recorded_other_threads():
    """The first recording's runs of seeds 0-4 at two threads, kept apart from ``recorded``: the
    same seeds as runs there, so no draws of their own; what the thread count changes, which
    no statistic of the chapters counts."""
    return load(packaged("results", "recorded", OTHER_THREADS))


CURVES = "curves"


def recorded_curves(method: str, k: int) -> list:
    """The run records (every epoch) of the recorded sweep's runs of ``method`` at ``k``, one
    per seed, sorted so, for the few points whose curves the book shows
    (``recorded/curves/``): the records the recording wrote, copied beside it; a test checks
    that their best and final errors are the sweep's."""
    from ..core.records import read_runs

    folder = Path(str(packaged("results", "recorded", CURVES)))
    found = [r for r in read_runs(folder) if r.config.get("extra", {}).get("sweep", {}).get("method") == method
             and r.config["extra"]["sweep"]["k"] == k]
    if not found:
        raise GuideError(f"no recorded curves for {method} at k = {k} in {folder}")
    return sorted(found, key=lambda r: (r.config["seed"], r.environment["cpu_threads"]))


def _point_arguments(run) -> None:
    study.add_point_arguments(run, ks=KS, seeds=SEEDS, methods=tuple(METHODS))


def build_parser() -> ArgumentParser:
    return STUDY.parser(PROG, __doc__.split("\n\n")[0], run_help="train every point of the sweep",
                        points=_point_arguments, results_dir="results/sweep",
                        threads_help="every point is trained at each")


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return STUDY.cli(build_parser().parse_args(argv), lambda args: run(
        points(args.ks, args.seeds, args.methods), args.results_dir, args.out, threads=args.threads, jobs=args.jobs,
        resume=args.resume, command=" ".join([PROG, *argv])))


if __name__ == "__main__":
    sys.exit(main())
