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

``python -m guide_utils sweep run [--ks 4 8 16 32] [--seeds 0 1 2] [--out FILE.csv]`` trains
every point and writes one run record per point plus a CSV of the results; ``summary
FILE.csv`` prints the table of means and spreads. On two otherwise idle CPU cores a k = 1
run takes about 30 s and the others about 10 s each; the ``seconds`` column records each
run's wall time under whatever else the machine was doing (the committed sweep shared it
with other jobs for part of its 24 minutes).
"""

from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..cli import ArgumentParser, one_line_errors
from ..errors import GuideError
from .experiments import SMOKE_BATCH as BASE_BATCH
from .experiments import SMOKE_QUALITY
from ..results.plots import hardware_label

PROG = "python -m guide_utils sweep"
# The catalogue's smoke quality settings: a sweep point is a smoke run of chapters 4-6.
SETTINGS = {**SMOKE_QUALITY, "progress": False}
METHODS = {"naive": {"lr_scaling": "none", "warmup": "none"},
           "linear": {"lr_scaling": "linear", "warmup": "none"},
           # gradual warmup from the k = 1 learning rate, as from one GPU's in the thesis
           "linear+warmup": {"lr_scaling": "linear", "warmup": "gradual", "warmup_epochs": 5,
                             "warmup_start_batch": BASE_BATCH}}
KS = (4, 8, 16, 32)
SEEDS = (0, 1, 2)
COLUMNS = ["k", "method", "seed", "global_batch", "peak_lr", "best_val_top1_err", "final_val_top1_err", "seconds"]


@dataclass(frozen=True)
class Point:
    k: int
    method: str  # "baseline" for k = 1
    seed: int

    @property
    def name(self) -> str:
        return f"sweep-k{self.k}-{self.method.replace('+', '-')}-seed{self.seed}"

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
    from ..config import make_config
    from ..engine import train
    from ..scaling import scaled_lr

    cfg = make_config("smoke", **point.settings(results_dir=str(results_dir), **overrides))
    cfg.extra = {"sweep": {"k": point.k, "method": point.method, "seed": point.seed}}
    result = train(cfg)
    errs = [e["val_top1_err"] for e in result.epochs]
    return {"k": point.k, "method": point.method, "seed": point.seed, "global_batch": cfg.per_worker_batch,
            "peak_lr": scaled_lr(cfg.base_lr, cfg.base_batch, cfg.per_worker_batch, rule=cfg.lr_scaling),
            "best_val_top1_err": round(min(errs), 3), "final_val_top1_err": round(errs[-1], 3),
            "seconds": round(sum(e["seconds"] for e in result.epochs), 1)}


def run(pts: list[Point], results_dir: str | Path, out: str | Path | None = None, progress: bool = True):
    """Train every point (skipping none), append rows to ``out`` as they finish, return the table."""
    import pandas as pd
    from tqdm import tqdm

    rows = []
    if out is not None:
        out = Path(out)
        if out.exists():
            raise GuideError(f"{out} already exists; choose another --out (results are never overwritten)")
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("x", encoding="utf-8") as fh:
            fh.write(f"# MNIST-1D quality sweep ({PROG}); measured {_dt.date.today().isoformat()} on "
                     f"{hardware_label()}\n{','.join(COLUMNS)}\n")
    for point in tqdm(pts, desc="sweep", disable=not progress, file=sys.stderr):
        row = run_point(point, results_dir)
        rows.append(row)
        if out is not None:
            with out.open("a", encoding="utf-8") as fh:
                fh.write(",".join(str(row[c]) for c in COLUMNS) + "\n")
    return pd.DataFrame(rows, columns=COLUMNS)


def load(path: str | Path):
    """A sweep CSV written by ``run``; ``.attrs['source']`` keeps its first line (date, hardware)."""
    from . import study_csv

    return study_csv.read(path, what="sweep", command=f"{PROG} run", columns=COLUMNS)


def summarise(table, metric: str = "best_val_top1_err"):
    """Mean, standard deviation and count per (k, method); the baseline as k = 1."""
    g = table.groupby(["k", "method"])[metric]
    out = g.agg(["mean", "std", "count"]).reset_index()
    out[["mean", "std"]] = out[["mean", "std"]].round(2)
    return out


RECORDED = "quality_sweep_mnist1d.csv"


def recorded():
    """The sweep this guide's book shows, run once with the defaults and committed (see its first line)."""
    from importlib import resources

    return load(resources.files("guide_utils.results") / "recorded" / RECORDED)


CURVES = "curves"


def recorded_curves(method: str, k: int) -> list:
    """The run records (every epoch) of the recorded sweep's points ``method`` at ``k``, one per
    seed, for the few points whose curves the book shows (``recorded/curves/``). They were
    trained again with the sweep's settings after the sweep itself; a test checks that their
    best and final errors are the sweep's, so they are the same runs."""
    from importlib import resources

    from ..results.records import read_runs

    folder = Path(str(resources.files("guide_utils.results") / "recorded" / CURVES))
    found = [r for r in read_runs(folder) if r.config.get("extra", {}).get("sweep", {}).get("method") == method
             and r.config["extra"]["sweep"]["k"] == k]
    if not found:
        raise GuideError(f"no recorded curves for {method} at k = {k} in {folder}")
    return sorted(found, key=lambda r: r.config["seed"])


def format_summary(summary) -> str:
    """One line per point: mean +- standard deviation (n seeds), for printing under a figure."""
    lines = []
    for row in summary.itertuples():
        spread = f" +- {row.std:.2f}" if row.count > 1 else ""
        lines.append(f"k={row.k:<3} {row.method:<14} {row.mean:6.2f} %{spread}  ({row.count} seed(s))")
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every point of the sweep")
    r.add_argument("--ks", type=int, nargs="+", default=list(KS), help="scaling factors (default: 4 8 16 32)")
    r.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="seeds per point (default: 0 1 2)")
    r.add_argument("--methods", nargs="+", default=list(METHODS), help="naive, linear, linear+warmup")
    r.add_argument("--results-dir", default="results/sweep", help="where the run records go")
    r.add_argument("--out", help="CSV of the results (must not exist yet)")
    s = sub.add_parser("summary", help="means and spreads of a sweep CSV")
    s.add_argument("csv")
    return p


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "summary":
        table = load(args.csv)
        print(table.attrs["source"])
        print(format_summary(summarise(table)))
        return 0
    pts = points(args.ks, args.seeds, args.methods)
    table = run(pts, args.results_dir, args.out)
    print(format_summary(summarise(table)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
