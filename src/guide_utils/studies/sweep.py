"""The quality sweep: does the thesis's large-batch pattern appear at laptop scale?

For each scaling factor k (global batch k x 32) it trains MNIST-1D's small CNN three ways,
several seeds each, and compares with the small-batch baseline (k = 1):

* ``naive``: the learning rate of the baseline, unchanged (thesis experiment 4);
* ``linear``: the linear scaling rule, lr x k, no warmup (experiment 5);
* ``linear+warmup``: the rule plus a gradual warmup (experiments 8 and 9).

A thesis worker count k is emulated by one process with the global batch (see
``guide_utils.studies.experiments``). Settings follow ``shared/notes/small-scale-quality.md``: 20,000
samples, 20 epochs, base lr 0.05 at batch 32, drops at 50 % and 75 % of training, 5 warmup
epochs. Quality is the best top-1 validation error over the epochs, as the thesis reports it.

``python -m guide_utils sweep run --jobs 2 --out FILE.csv`` trains every point with five
seeds at one and at two CPU threads (``--seeds``, ``--threads``), writes one run record per run
and appends its row to the CSV as it finishes (``--resume`` finishes an interrupted file);
``summary FILE.csv`` prints each point's median, worst run and how many runs ended within one
point of the baseline. The thread count is part of the recording because near the edge of
stability the order of floating-point sums decides some runs (see ``studies.study``). On two
otherwise idle CPU cores a k = 1 run takes 30 to 45 s and the others 10 to 15 s; the
``seconds`` column records each run's wall time under whatever else the machine was doing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from .experiments import SMOKE_BATCH as BASE_BATCH
from .experiments import SMOKE_QUALITY
from . import study

PROG = "python -m guide_utils sweep"
# The catalogue's smoke quality settings: a sweep point is a smoke run of chapters 4-6.
SETTINGS = {**SMOKE_QUALITY, "progress": False, "quiet": True}
METHODS = {"naive": {"lr_scaling": "none", "warmup": "none"},
           "linear": {"lr_scaling": "linear", "warmup": "none"},
           # gradual warmup from the k = 1 learning rate, as from one GPU's in the thesis
           "linear+warmup": {"lr_scaling": "linear", "warmup": "gradual", "warmup_epochs": 5,
                             "warmup_start_batch": BASE_BATCH}}
KS = (4, 8, 16, 32)
SEEDS = (0, 1, 2, 3, 4)
THREADS = (1, 2)
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


def run_point(point: Point, results_dir: str | Path, **overrides) -> dict:
    """Train one point through the engine; returns its row of the results table."""
    import torch

    from ..core.config import make_config
    from ..engine import train
    from ..core.scaling import scaled_lr

    cfg = make_config("smoke", **point.settings(results_dir=str(results_dir), **overrides))
    cfg.extra = {"sweep": {"k": point.k, "method": point.method, "seed": point.seed}}
    result = train(cfg)
    errs = [e["val_top1_err"] for e in result.epochs]
    return {**point.key(), "threads": torch.get_num_threads(), "global_batch": cfg.per_worker_batch,
            "peak_lr": scaled_lr(cfg.base_lr, cfg.base_batch, cfg.per_worker_batch, rule=cfg.lr_scaling),
            "best_val_top1_err": round(min(errs), 3), "final_val_top1_err": round(errs[-1], 3),
            "seconds": round(sum(e["seconds"] for e in result.epochs), 1)}


def run(pts: list[Point], results_dir: str | Path, out: str | Path | None = None, *,
        threads: Sequence[int] = THREADS, jobs: int = 1, resume: bool = False, command: str | None = None,
        progress: bool = True, title: str = "MNIST-1D quality sweep", overrides: dict | None = None):
    """Train every point at every thread count (``jobs`` cores busy), appending rows to ``out``
    as they finish; with ``resume`` the runs ``out`` already holds are skipped. Returns the
    table of this call's runs (all of ``out`` when it was given). ``overrides`` change the
    settings of every run (tests shrink the problem with them)."""
    import pandas as pd

    threads = study.check_threads(threads, jobs)
    rows: list[dict] = []
    sink = None
    if out is not None:
        header = study.provenance(title, command or f"{PROG} run", threads=threads, jobs=jobs)
        sink = study.Sink(out, COLUMNS, header, key=KEY, resume=resume)
    todo = {t: [p for p in pts if sink is None or sink.key({**p.key(), "threads": t}) not in sink.done]
            for t in threads}
    bar = study.progress("sweep", sum(map(len, todo.values()))) if progress else None

    def report(row: dict) -> None:
        rows.append(row)
        if sink is not None:
            sink.write(row)
        if bar is not None:
            bar.update()
            bar.set_postfix_str(f"k={row['k']} {row['method']} seed {row['seed']} x{row['threads']}: "
                                f"{row['best_val_top1_err']:.2f} %")

    try:
        for t, tasks in todo.items():
            study.train_all(tasks, run_point, t, jobs, report, results_dir=results_dir, **(overrides or {}))
    finally:
        if bar is not None:
            bar.close()
    return load(out) if out is not None else pd.DataFrame(rows, columns=COLUMNS)


def load(path: str | Path):
    """A sweep CSV written by ``run``; ``.attrs['source']`` keeps its first line (date, hardware)."""
    from . import study_csv

    return study_csv.read(path, what="sweep", command=f"{PROG} run", columns=COLUMNS)


RECORDED = "quality_sweep_mnist1d.csv"


def recorded():
    """The sweep this guide's book shows, run once with the defaults and committed (see its first line)."""
    from importlib import resources

    return load(resources.files("guide_utils.results") / "recorded" / RECORDED)


CURVES = "curves"


def recorded_curves(method: str, k: int) -> list:
    """The run records (every epoch) of the recorded sweep's runs of ``method`` at ``k``, one
    per seed and thread count, sorted so, for the few points whose curves the book shows
    (``recorded/curves/``): the records the recording wrote, copied beside it; a test checks
    that their best and final errors are the sweep's."""
    from importlib import resources

    from ..core.records import read_runs

    folder = Path(str(resources.files("guide_utils.results") / "recorded" / CURVES))
    found = [r for r in read_runs(folder) if r.config.get("extra", {}).get("sweep", {}).get("method") == method
             and r.config["extra"]["sweep"]["k"] == k]
    if not found:
        raise GuideError(f"no recorded curves for {method} at k = {k} in {folder}")
    return sorted(found, key=lambda r: (r.config["seed"], r.environment["cpu_threads"]))


def baseline_median(table, metric: str = "best_val_top1_err") -> float:
    """The reference every method is judged against: the median of the k = 1 runs."""
    return float(table[table["method"] == "baseline"][metric].median())


def outcomes(table, within: float = 1.0, by=("k", "method")):
    """Per point: runs, median, best, worst, and how many runs ended within ``within`` points
    of the baseline's median (``study.outcomes``); ``by`` may add ``threads``. Rows in the
    order k, then baseline, naive, linear, linear + warmup."""
    return study.outcomes(table, list(by), baseline_median(table), within=within, order=["baseline", *METHODS])


def format_outcomes(table, within: float = 1.0) -> str:
    return study.format_outcomes(table, within=within)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every point of the sweep")
    r.add_argument("--ks", type=int, nargs="+", default=list(KS), help="scaling factors (default: 4 8 16 32)")
    r.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="seeds per point (default: 0 to 4)")
    r.add_argument("--methods", nargs="+", default=list(METHODS), help="naive, linear, linear+warmup")
    r.add_argument("--out", help="CSV of the results (must not exist yet, unless --resume)")
    study.add_run_arguments(r, threads=THREADS, results_dir="results/sweep",
                            threads_help="every point is trained at each")
    s = sub.add_parser("summary", help="medians, worst runs and counts of a sweep CSV")
    s.add_argument("csv")
    return p


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "summary":
        table = load(args.csv)
        print(table.attrs["source"])
    else:
        if args.resume and not args.out:
            raise GuideError("--resume needs --out, the CSV to finish")
        pts = points(args.ks, args.seeds, args.methods)
        table = run(pts, args.results_dir, args.out, threads=args.threads, jobs=args.jobs, resume=args.resume,
                    command=" ".join([PROG, *argv]))
    print(format_outcomes(outcomes(table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
