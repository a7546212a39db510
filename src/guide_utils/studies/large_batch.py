"""Past the linear rule: which rule or optimizer still trains at a global batch of 8192?

The thesis stopped at a global batch of 4096 and named what lies beyond: an upper bound
near 8k for the linear rule (Goyal et al. 2017) and layer-wise adaptive optimizers for
larger batches. This study trains MNIST-1D's small CNN at scaling factors k up to 256
(global batch k x 32 = 8192) four ways, each with a 5-epoch gradual warmup from the k = 1
learning rate, several seeds each:

* ``linear+warmup``: SGD, learning rate x k (Goyal et al. 2017; chapters 5 and 6);
* ``sqrt+warmup``: SGD, learning rate x sqrt(k) (Krizhevsky 2014; Hoffer et al. 2017);
* ``lars+warmup``: LARS, learning rate x k (You, Gitman and Ginsburg 2017);
* ``lamb+warmup``: LAMB, learning rate x sqrt(k), the rule its paper uses (You et al. 2020).

Each optimizer's base learning rate (at batch 32) is chosen by the command itself, not by
hand: every value in ``TUNING`` is trained at k = 1 with seed 0 for the first
``TUNING_EPOCHS`` epochs (a quarter of a run, before any decay), and the one with the lowest
best validation error is kept. Those short runs are rows of the recorded table (``stage``
``tune``), so the choice can be checked (``chosen_lrs``). The grids differ because the optimizers' learning rates mean
different things: SGD's multiplies the gradient; LARS's (timm, trust coefficient 0.001)
multiplies ``0.001 x |w| / |g|`` per layer, so its values are tens of times SGD's; LAMB's is
the size of each layer's step relative to its weights, Adam-like, so a few 1e-3. Each grid
is a factor of 2 either side of the value a short exploration found best (6 epochs, 20,000
samples, k = 1: LARS 0.5 / 2 / 8 gave 4.3 / 1.8 / 3.3 % error, LAMB 0.001 / 0.004 / 0.016
gave 5.6 / 2.4 / 10.9 %); SGD's around the 0.05 at batch 32 that chapters 4-6 use. The full
k = 1 run of SGD at its chosen rate, with every seed, is the baseline every method is
measured against.

Data: 40,960 MNIST-1D samples, of which 32,768 (2^15) train, so every k divides the
training set: k = 256 gets 4 optimizer steps per epoch, 80 in 20 epochs (20 of them in
warmup), k = 128 twice that. The 20,000-sample sweep of chapters 4-6 would leave k = 256
one step per epoch, too few for a warmup to ramp over. Twice the samples (8 steps per
epoch) would double the cost, which this study had to fit into two shared CPU cores. For the
same reason it has two values of k, the thesis's 32 GPUs (global batch 1024) and Goyal et
al.'s upper bound (8192), short tuning runs, and full k = 1 runs for SGD only (LARS and LAMB
at k = 1 are their tuning runs). Each point has ten seeds, each one draw (``draws``: the same
seed at another thread count starts from the same weights and data order: not another draw),
trained at one CPU thread; the thread count is recorded with every run, since near the edge of
stability the order of floating-point sums decides some runs. ``--ks 32 128 256`` adds the thesis's largest global
batch (4096).

``python -m guide_utils large-batch run --out FILE.csv --jobs 2`` trains the tuning runs (at
the first thread count), then every point at every thread count, appending one row per run
as it finishes (``--jobs`` cores kept busy; ``--resume`` finishes an interrupted file, or adds
the seeds it lacks). ``summary FILE.csv`` prints each point's median, worst run and how many
runs ended near the baseline (no worse than its worst run: ``draws.tolerance``).
The CSV's first line says when, on what, with which thread counts, from which commit and
with which versions it was made.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..core.paths import packaged
from .experiment_plans import SMOKE_BATCH as BASE_BATCH
from .experiment_plans import SMOKE_QUALITY
from . import study, workers

PROG = "python -m guide_utils large-batch"
SAMPLES = 40_960
TRAIN_SAMPLES = int(SAMPLES * 0.8)  # MNIST-1D's own split: 32,768
SETTINGS = {**SMOKE_QUALITY, "mnist1d_samples": SAMPLES, "progress": False, "quiet": True}
WARMUP = {"warmup": "gradual", "warmup_epochs": 5, "warmup_start_batch": BASE_BATCH}
METHODS = {"linear+warmup": {"optimizer": "sgd", "lr_scaling": "linear"},
           "sqrt+warmup": {"optimizer": "sgd", "lr_scaling": "sqrt"},
           "lars+warmup": {"optimizer": "lars", "lr_scaling": "linear"},
           "lamb+warmup": {"optimizer": "lamb", "lr_scaling": "sqrt"}}
# Base learning rates tried at k = 1 (batch 32); see the module doc for the centres.
TUNING = {"sgd": (0.025, 0.05, 0.1), "lars": (1.0, 2.0, 4.0), "lamb": (0.002, 0.004, 0.008)}
TUNING_SEED = 0
TUNING_EPOCHS = 5
KS = (32, 256)
SEEDS = tuple(range(10))  # ten draws per point
THREADS = (1,)
CURVE_COLUMNS = ("val_curve", "train_curve")
KEY = ["stage", "k", "method", "optimizer", "base_lr", "seed", "threads"]  # what identifies a run
COLUMNS = ["stage", "k", "method", "optimizer", "lr_scaling", "seed", "threads", "epochs", "global_batch", "base_lr",
           "peak_lr", "steps_per_epoch", "best_val_top1_err", "final_val_top1_err", "seconds", "cpu_seconds",
           *CURVE_COLUMNS]


@dataclass(frozen=True)
class Point:
    k: int
    method: str  # "baseline" at k = 1 (any rule gives the base rate there)
    optimizer: str
    base_lr: float
    seed: int
    tuning_epochs: int | None = None  # set: a short run that chooses the base learning rate

    @property
    def stage(self) -> str:
        return "tune" if self.tuning_epochs else "study"

    @property
    def name(self) -> str:
        return (f"large-batch-{self.stage}-k{self.k}-{self.method.replace('+', '-')}-{self.optimizer}"
                f"-lr{self.base_lr:g}-seed{self.seed}")

    @property
    def lr_scaling(self) -> str:
        return "linear" if self.method == "baseline" else METHODS[self.method]["lr_scaling"]

    def key(self) -> dict:
        return {"stage": self.stage, "k": self.k, "method": self.method, "optimizer": self.optimizer,
                "base_lr": self.base_lr, "seed": self.seed}

    def settings(self, **overrides) -> dict:
        """``TrainConfig`` overrides of this point (on top of the smoke profile)."""
        warmup = {"warmup": "none"} if self.k == 1 else WARMUP
        out = {**SETTINGS, **warmup, "optimizer": self.optimizer, "lr_scaling": self.lr_scaling,
               "base_lr": self.base_lr, "base_batch": BASE_BATCH, "per_worker_batch": BASE_BATCH * self.k,
               "seed": self.seed, "run_name": self.name, **overrides}
        if self.tuning_epochs:
            out["epochs"] = min(self.tuning_epochs, out["epochs"])
        return out

    def config(self, **overrides):
        """The ``TrainConfig`` of this point (the smoke profile and ``settings``), labelled as the study's."""
        return study.smoke_config(self.settings(**overrides), {"large_batch": asdict(self)})


def tuning_points(optimizers: Iterable[str] = tuple(TUNING)) -> list[Point]:
    """Every base learning rate of ``TUNING`` at k = 1, seed ``TUNING_SEED``, ``TUNING_EPOCHS`` epochs."""
    return [Point(1, "baseline", opt, lr, TUNING_SEED, TUNING_EPOCHS) for opt in optimizers for lr in TUNING[opt]]


def sweep_points(lrs: dict[str, float], ks: Iterable[int] = KS, seeds: Iterable[int] = SEEDS,
                 methods: Iterable[str] = tuple(METHODS)) -> list[Point]:
    """The SGD baseline at k = 1 and its chosen rate, every seed; then every (k, method, seed)."""
    ks, seeds, methods = list(ks), list(seeds), list(methods)
    _check(ks, methods)
    base = [Point(1, "baseline", "sgd", lrs["sgd"], s) for s in seeds]
    return base + [Point(k, m, METHODS[m]["optimizer"], lrs[METHODS[m]["optimizer"]], s)
                   for k in ks for m in methods for s in seeds]


def _check(ks: list[int], methods: list[str]) -> None:
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise GuideError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    if any(k < 2 or TRAIN_SAMPLES // (BASE_BATCH * k) < 1 for k in ks):
        raise GuideError(f"--ks must be 2 to {TRAIN_SAMPLES // BASE_BATCH} (k = 1 is the baseline, always "
                         f"included; larger k leaves no full batch of {TRAIN_SAMPLES} samples), got {ks}")


def row(point: Point, cfg, result) -> dict:
    """A trained point's row of the results table (``COLUMNS``; the study adds ``threads`` and
    ``cpu_seconds``)."""
    val = [e["val_top1_err"] for e in result.epochs]
    train_err = [e["train_top1_err"] for e in result.epochs]
    return {**point.key(), "lr_scaling": point.lr_scaling, "epochs": cfg.epochs, **study.quality(cfg, result),
            "steps_per_epoch": TRAIN_SAMPLES // cfg.per_worker_batch if cfg.mnist1d_samples == SAMPLES else None,
            "val_curve": " ".join(f"{v:.3f}" for v in val), "train_curve": " ".join(f"{v:.3f}" for v in train_err)}


def describe(row: dict) -> str:
    return (f"{row['stage']} k={row['k']} {row['method']} ({row['optimizer']}, base lr {row['base_lr']:g}) "
            f"seed {row['seed']} x{row['threads']}: {row['best_val_top1_err']:.2f} % ({row['cpu_seconds']:.0f} s CPU)")


def summary(table) -> str:
    return (f"base learning rates chosen at k = 1: {chosen_lrs(table)}; {len(table)} runs, "
            f"{cpu_hours(table):.2f} CPU-hours\n{STUDY.format(own(STUDY.outcomes(table)))}")




def run_point(point: Point, results_dir: str | Path, **overrides) -> dict:
    """Train one point through the engine in this process; its row of the results table."""
    return workers.train_point(point, row, results_dir=str(results_dir), **overrides)


def recorded_point(table, k: int, method: str, seed: int = 0, threads: int = THREADS[0]) -> tuple[Point, object]:
    """The ``Point`` that made a recorded row of the study, and the row (at ``threads``)."""
    row = full_runs(table).query("k == @k and method == @method and seed == @seed and threads == @threads").iloc[0]
    return Point(int(row["k"]), row["method"], row["optimizer"], float(row["base_lr"]), int(row["seed"])), row


def replay(point: Point, results_dir: str | Path, *, epochs: int = 2, threads: int = 1) -> dict:
    """The first ``epochs`` epochs of a recorded point trained again as the recording trained
    it (a fresh process with ``threads`` threads): its row. The schedule of the first epochs
    does not depend on the run's length, so they are the same epochs as the full run's."""
    with STUDY.open(threads=[threads], progress=False) as session:
        session.train([point], overrides={"results_dir": str(results_dir), "epochs": epochs})
    return session.rows[0]


def early_agreement(table, row: dict, epochs: int = 2) -> list[tuple[float, float, float, bool]]:
    """For each of a replay's first ``epochs`` epochs: its validation error, the band the
    recorded runs of its point (every seed and thread count) allow at that epoch
    (``study.band``), and whether it lies inside. Early in warmup the error moves fast and
    runs differ by seed and by the order of sums, so one recorded run is no yardstick."""
    same = full_runs(table).query("k == @row['k'] and method == @row['method']")
    out = []
    for e, value in enumerate(epoch_curve(row)[:epochs]):
        lo, hi = study.band([epoch_curve(r)[e] for _, r in same.iterrows()])
        out.append((value, lo, hi, lo <= value <= hi))
    return out


def chosen_lrs(table) -> dict[str, float]:
    """Each optimizer's base learning rate: the tuning value with the lowest best validation error."""
    tune = tuning(table)
    out = {}
    for opt, rows in tune.groupby("optimizer", sort=False):
        out[opt] = float(rows.sort_values(["best_val_top1_err", "base_lr"]).iloc[0]["base_lr"])
    return out


def tuning(table):
    """The short k = 1 runs the base learning rates were chosen by."""
    return table[table["stage"] == "tune"]


def full_runs(table):
    """Every run of full length (the study proper)."""
    return table[table["stage"] == "study"]


def run(out: str | Path, *, ks=KS, seeds=SEEDS, methods=tuple(METHODS), threads: Sequence[int] = THREADS,
        results_dir="results/large-batch", jobs: int = 1, resume: bool = False, argv: list[str] | None = None,
        overrides: dict | None = None):
    """Tune at k = 1 (at the first thread count), then train every point at every thread count;
    rows are appended to ``out`` (never overwritten; ``resume`` finishes an interrupted file).
    ``overrides`` change the settings of every run (tests shrink the problem with them)."""
    ks, seeds, methods = list(ks), list(seeds), list(methods)
    _check(ks, methods)
    if TUNING_SEED not in seeds:
        raise GuideError(f"--seeds must include {TUNING_SEED}, the seed the k = 1 tuning runs use")
    command = " ".join([PROG, *(argv if argv is not None else ["run", "--out", str(out)])])
    overrides = {"results_dir": str(results_dir), **(overrides or {})}
    # SGD always: its k = 1 baseline is the reference every method is measured against.
    optimizers = list(dict.fromkeys(["sgd", *(METHODS[m]["optimizer"] for m in methods)]))
    with STUDY.open(out, threads=threads, jobs=jobs, resume=resume, command=command) as session:
        session.train(tuning_points(optimizers), threads=session.threads[:1], overrides=overrides)
        session.train(sweep_points(chosen_lrs(session.table()), ks, seeds, methods), overrides=overrides)
    return session.table()


def load(path: str | Path):
    """A CSV written by ``run``; ``.attrs['source']`` keeps its first line."""
    return STUDY.load(path)


RECORDED = "large_batch_mnist1d.csv"


def recorded():
    """The sweep chapter 13 shows, run once with the defaults and committed (see its first line)."""
    return load(packaged("results", "recorded", RECORDED))


def curves(table):
    """Every run of the study proper, one row per seed. The SGD baseline appears as method
    ``baseline`` (the figures draw it as a band) and as the k = 1 point of the methods that
    train with SGD (``method`` relabelled)."""
    import pandas as pd

    lrs = chosen_lrs(table)
    table = full_runs(table)
    base = table[(table["k"] == 1) & (table["base_lr"] == table["optimizer"].map(lrs))]
    parts = [table[table["k"] > 1], base[base["optimizer"] == "sgd"]]
    for method, spec in METHODS.items():
        if (table["method"] == method).any():
            parts.append(base[base["optimizer"] == spec["optimizer"]].assign(method=method))
    return pd.concat(parts, ignore_index=True)


def epoch_curve(row, column: str = "val_curve") -> list[float]:
    """A row's per-epoch errors (``val_curve`` or ``train_curve``) as numbers."""
    return [float(v) for v in str(row[column]).split()]


def breaking_point(outcomes, method: str) -> int | None:
    """The smallest k at which ``method``'s median error is past the limit of ``outcomes``
    (``study.outcomes``: the k = 1 SGD baseline's worst run); None: it never is."""
    rows = outcomes[(outcomes["method"] == method) & (outcomes["k"] > 1)].sort_values("k")
    worse = rows[rows["median"] > rows["limit"]]
    return int(worse["k"].iloc[0]) if not worse.empty else None


def cpu_hours(table) -> float:
    return float(table["cpu_seconds"].sum()) / 3600


def cluster_commands(nodes: int = 64, gpus_per_node: int = 4, per_gpu: int = 32) -> dict[str, str]:
    """How each method runs at ImageNet scale through the sbatch examples: 06 (Horovod, gradual
    warmup; its array index 0 is a per-GPU batch of 32) with the method's flags. LARS and LAMB
    need base rates tuned for the problem first (LR, B: yours to fill in)."""
    from ..core.scaling import global_batch

    gbatch = global_batch(per_gpu, nodes * gpus_per_node)
    submit = (f"WARMUP=gradual slurm_examples/submit.sh slurm_examples/06_learning_rate_warmup.sbatch "
              f"--nodes={nodes} --array=0 --")
    flags = {"linear+warmup": "", "sqrt+warmup": " --lr-scaling sqrt",
             "lars+warmup": " --optimizer lars --base-lr LR --base-batch B",
             "lamb+warmup": " --optimizer lamb --lr-scaling sqrt --base-lr LR --base-batch B"}
    return {m: f"{submit}{f}   # global batch {gbatch}" for m, f in flags.items()}


def own(outcomes):
    """``outcomes`` without the SGD baseline's copies at k = 1 that ``curves`` adds for the
    figure (each SGD method's first point): the rows a summary lists."""
    return outcomes[(outcomes["k"] > 1) | (outcomes["method"] == "baseline")]


# The summary reads ``curves``: the study proper, the SGD baseline as each SGD method's k = 1.
STUDY = study.Study("large-batch", "MNIST-1D large-batch sweep", f"{PROG} run", tuple(COLUMNS), tuple(KEY), row,
                    threads=THREADS, summary=summary, describe=describe, order=("baseline", *METHODS),
                    text_columns=CURVE_COLUMNS, runs=curves, by=("k", "method"), reference=study.BASELINE,
                    help="past the linear rule: sqrt scaling, LARS and LAMB up to a global batch of 8192")
outcomes, format_outcomes = STUDY.outcomes, STUDY.format


def _point_arguments(run) -> None:
    study.add_point_arguments(run, ks=KS, seeds=SEEDS, methods=tuple(METHODS))


def build_parser() -> ArgumentParser:
    return STUDY.parser(PROG, __doc__.split("\n\n")[0], points=_point_arguments, out_required=True,
                        run_help="tune the base learning rates at k = 1, then train every point",
                        results_dir="results/large-batch",
                        threads_help="every point is trained at each, the tuning at the first")


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return STUDY.cli(build_parser().parse_args(argv), lambda args: run(
        args.out, ks=args.ks, seeds=args.seeds, methods=args.methods, threads=args.threads,
        results_dir=args.results_dir, jobs=args.jobs, resume=args.resume, argv=argv))


if __name__ == "__main__":
    sys.exit(main())
