"""The thesis's nine experiments and the SLICES slides' benchmark as named runs at two
scales, and how each run is started: the plan that ``experiments list`` and ``--dry-run``
print. Training them is :mod:`guide_utils.studies.experiments`, whose names these are too.

Every experiment is a list of runs, each a set of ``TrainConfig`` overrides plus the number
of workers it needs. The ``full`` profile is the thesis's setting (ResNet-50, ImageNet,
90 epochs, per-GPU batch 128 unless the experiment changes it, the GPU counts of its
tables); ``--dry-run`` prints each run's submission through ``slurm_examples/`` and runs
nothing. The ``smoke`` profile keeps the structure and shrinks the problem: MNIST-1D and
its small CNN, and every thesis worker count k becomes a *global* batch of k x 32 trained
by one process, so the learning-rate rule sees the same scaling factor k as on the cluster.
One process with the global batch is an emulation: BatchNorm then normalises over the
whole global batch instead of each worker's share (chapter 4 shows both ways agreeing).

Throughput experiments (1-3) measure images/s on synthetic data for a few hundred
iterations (the thesis's ``--num_batches=200``); quality experiments (4-9) train to the end.

``slices`` is the benchmark of the SLICES slides ("Benchmark parameters"): per-worker batch
32, 64 and 96 on 1 to 10 nodes of one GPU each, on a 1 and a 10 Gbit/s network, and ten
separate one-GPU jobs against one job of ten GPUs. The slides name ImageNet but no model;
the guide's ResNet-50 stands in. The network is not a setting of a run: the site profile
exports ``GUIDE_NETWORK`` (e.g. ``10Gbit/s``, ``slurm_examples/sites/byoc.sh``) and every run
record keeps it in its environment, so runs on the two networks can be told apart. A run
with ``copies`` > 1 is that many independent one-worker jobs (a job array), none talking to
another: the no-communication limit the ten-GPU job is measured against.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..core.config import make_config
from ..core.errors import GuideError

PROG = "python -m guide_utils experiments"
SMOKE_BATCH = 32  # smoke: the per-worker batch of "one thesis GPU"
# Smoke quality runs: MNIST-1D with the settings of the book's methods page, book/methods.md
# (base lr 0.05 at batch 32, drops at 50 % and 75 % of training). 20,000 samples give the
# largest global batch (1024) 15 steps per epoch; with fewer, warmup has too few steps to
# work and the runs show the size of the problem rather than the method (measured: 8,000
# samples and 10 epochs left k = 32 with stepping warmup at 46 % error).
SMOKE_QUALITY = {"model": "mnist1d_cnn", "data": "mnist1d", "mnist1d_samples": 20000, "epochs": 20,
                 "base_lr": 0.05, "base_batch": SMOKE_BATCH, "milestones": (10, 15), "loader_workers": 0}
# The thesis's warmup epochs at smoke scale. 5 is kept (a larger share of 20 epochs than of 90).
# 10 would end exactly at the first drop (epoch 10) and exp9 would never train at its peak rate,
# where the thesis's 10-epoch warmup left 20 epochs at the peak before its first drop (epoch 30):
# 7 leaves 3, still after a longer warmup than exp8's 5.
SMOKE_WARMUP = {5: 5, 10: 7}
SMOKE_THROUGHPUT = {"model": "small_resnet", "data": "synthetic", "image_size": 32, "epochs": 1,
                    "max_steps_per_epoch": 20, "throughput_warmup_iters": 5, "loader_workers": 0}
FULL_THROUGHPUT = {"data": "synthetic", "epochs": 1, "max_steps_per_epoch": 200, "throughput_warmup_iters": 20}
# What a full quality run trains on: no dataset of its own (the full profile never guesses
# one), the --data the sbatch scripts pass, the site's staged GUIDE_DATASET_ARCHIVE.
SITE_DATA = "ImageNet (the site's GUIDE_DATASET_ARCHIVE)"


@dataclass(frozen=True)
class PlannedRun:
    """One run of an experiment: what it is called, how many workers, which settings."""

    label: str
    workers: int
    settings: dict[str, Any] = field(default_factory=dict)
    copies: int = 1  # independent copies of the run, each its own job (a job array); 1: one run


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    source: str  # where in the source document (the thesis, the SLICES slides)
    kind: str  # "throughput" or "quality"
    grid: tuple[dict[str, Any], ...]  # per run: workers, per_worker_batch, dist, lr_scaling, warmup, warmup_epochs
    single_node: bool = False  # every multi-worker run on one node (launched by 02, not 03)
    note: str = ""  # what the plan must say besides the runs (printed with --dry-run)


def _quality_run(workers, lr_scaling="linear", warmup="none", warmup_epochs=5, per_worker_batch=128, **extra):
    """A quality run of the thesis: trained to the end, judged by validation error."""
    return {"workers": workers, "per_worker_batch": per_worker_batch, "lr_scaling": lr_scaling, "warmup": warmup,
            "warmup_epochs": warmup_epochs, "dist": "none" if workers == 1 else "horovod", **extra}


def _throughput_run(workers, per_worker_batch, dist="horovod", copies=1):
    """A throughput run: a few hundred iterations on synthetic data (``copies``: that many
    separate one-worker jobs)."""
    if copies > 1 and workers != 1:
        raise GuideError(f"copies are separate one-worker jobs; {copies} copies of {workers} workers is not one")
    run = {"workers": workers, "per_worker_batch": per_worker_batch, "dist": "none" if workers == 1 else dist}
    return {**run, "copies": copies} if copies > 1 else run


# The SLICES slides' benchmark: batch 32, 64, 96 on 1-10 nodes (one GPU each on the testbed,
# GUIDE_TASKS_PER_NODE=1), then, per batch, ten one-GPU jobs (the slides' "10 jobs with 1 GPU
# each"), against the 10-node run of the same batch ("1 job with 10 GPUs").
SLICES_BATCHES = (32, 64, 96)
SLICES_NODES = tuple(range(1, 11))
SLICES_NOTE = ("the network is not a run setting: run the grid once per network, with GUIDE_NETWORK "
               "(e.g. 1Gbit/s, 10Gbit/s) in the site profile; each record keeps it")


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment("exp1", "Throughput: single-GPU baseline", "thesis 5.1, Appendix 1", "throughput",
               tuple(_throughput_run(1, b) for b in (32, 64, 128))),
    # The thesis's plain-PyTorch runs of experiment 2 were one process driving every GPU of the
    # node (the examples script's DataParallel path, Appendix 2); the guide runs DDP instead.
    Experiment("exp2", "Throughput: one node, Horovod vs PyTorch (thesis: DataParallel; here: DDP)",
               "thesis 5.2, Appendix 2", "throughput",
               tuple(_throughput_run(w, b, d) for d in ("horovod", "ddp") for w in (2, 4) for b in (32, 64, 128)),
               single_node=True),
    Experiment("exp3", "Throughput: many nodes", "thesis 5.3, Appendix 3", "throughput",
               tuple(_throughput_run(w, b) for w in (8, 16, 24, 32) for b in (32, 64, 128))),
    # PyTorch-examples defaults: lr 0.1 for any batch, drops every 30 epochs.
    Experiment("exp4", "Quality: naive scaling (learning rate unchanged)", "thesis 5.4, Table 10", "quality",
               tuple(_quality_run(w, lr_scaling="none", milestones=(30, 60)) for w in (1, 2, 16, 24, 32))),
    Experiment("exp5", "Quality: linear scaling rule, no warmup", "thesis 5.5, Table 11", "quality",
               tuple(_quality_run(w) for w in (1, 32))),
    Experiment("exp6", "Quality: linear scaling + 5-epoch stepping warmup", "thesis 5.6, Table 12", "quality",
               (_quality_run(1),) + tuple(_quality_run(w, warmup="stepping") for w in (8, 16, 24, 32))),
    Experiment("exp7", "Quality: per-worker batch 32 on 32 GPUs", "thesis 5.7, Table 13", "quality",
               (_quality_run(32, warmup="stepping", per_worker_batch=32),)),
    Experiment("exp8", "Quality: linear scaling + 5-epoch gradual warmup", "thesis 5.8, Table 14", "quality",
               (_quality_run(1),) + tuple(_quality_run(w, warmup="gradual") for w in (16, 24, 32))),
    Experiment("exp9", "Quality: linear scaling + 10-epoch gradual warmup", "thesis 5.9, Table 15", "quality",
               tuple(_quality_run(w, warmup="gradual", warmup_epochs=10) for w in (24, 32))),
    Experiment("slices", "Throughput: 1-10 nodes at 1 vs 10 GbE, and ten 1-GPU jobs (SLICES testbed)",
               "SLICES slides, Benchmark parameters", "throughput",
               tuple(_throughput_run(n, b) for n in SLICES_NODES for b in SLICES_BATCHES)
               + tuple(_throughput_run(1, b, copies=len(SLICES_NODES)) for b in SLICES_BATCHES),
               note=SLICES_NOTE),
]}


def runs(name: str, profile: str) -> list[PlannedRun]:
    """The runs of experiment ``name`` at ``profile`` scale."""
    if name not in EXPERIMENTS:
        raise GuideError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)} "
                         f"({PROG} list shows them)")
    if profile not in ("smoke", "full"):
        raise GuideError(f"unknown profile {profile!r}; choose smoke or full")
    exp = EXPERIMENTS[name]
    out = []
    for point in exp.grid:
        point = dict(point)
        workers = point.pop("workers")
        copies = point.pop("copies", 1)
        if exp.kind == "throughput":
            base = FULL_THROUGHPUT if profile == "full" else SMOKE_THROUGHPUT
            label = f"{workers} worker(s) x {point['per_worker_batch']} ({point['dist']})"
            if copies > 1:
                label = f"{copies} separate jobs of " + label
        else:
            base = {} if profile == "full" else SMOKE_QUALITY
            warm = f", {point['warmup']} warmup {point['warmup_epochs']} ep" if point["warmup"] != "none" else ""
            label = f"{workers} GPU(s) x {point['per_worker_batch']}, lr {point['lr_scaling']}{warm}"
        settings = {**base, **point}
        if profile == "smoke":
            if exp.kind == "quality":
                # k thesis GPUs -> one process with a global batch of k x 32 (see the module doc)
                settings["per_worker_batch"] = SMOKE_BATCH * workers * point["per_worker_batch"] // 128
                settings["warmup_epochs"] = SMOKE_WARMUP[point["warmup_epochs"]]
                settings["milestones"] = SMOKE_QUALITY["milestones"]
                if point["warmup"] == "gradual":
                    # start where one thesis GPU's share would: one process is emulating k of them
                    settings["warmup_start_batch"] = SMOKE_BATCH * point["per_worker_batch"] // 128
                settings["dist"] = "none"
                workers = 1
                label += f" -> smoke: global batch {settings['per_worker_batch']} in one process"
                if settings["warmup_epochs"] != point["warmup_epochs"]:
                    label += f", warmup {settings['warmup_epochs']} ep"
            else:
                if workers > 2:  # a laptop runs at most two processes
                    label += " -> smoke: 2 workers"
                    workers = 2
                if copies > 2:
                    label += " -> smoke: 2 copies"
                    copies = 2
                if workers == 1:
                    settings["dist"] = "none"
        out.append(PlannedRun(label, workers, settings, copies))
    return out


def launch_command(name: str, run: PlannedRun, profile: str, index: int) -> str:
    """How to start one run: the engine's command on a laptop, a submission on the cluster.

    A multi-worker cluster run asks ``submit.sh`` for ``--workers=N``: the site profile
    knows the GPUs per node (4 on the thesis's nodes, 8 on many newer ones) and turns N
    into ``--nodes`` and ``--ntasks-per-node``, so the global batch, and with it the
    learning rate, is the thesis's at every site. A run of several copies is a job array of
    one-GPU jobs (``--array=0-C``), on a laptop that many processes at once.
    """
    if profile == "smoke":
        train = "python -m guide_utils.train --profile smoke " + " ".join(_flags(run, keep_dist=True))
        if run.copies > 1:
            return f"for copy in $(seq {run.copies}); do {train} & done; wait"
        if run.workers == 1:
            return train
        if run.settings["dist"] == "ddp":
            return train.replace("python -m guide_utils.train", f"torchrun --standalone --nproc-per-node {run.workers} "
                                 "-m guide_utils.train", 1)
        return f"horovodrun -np {run.workers} --gloo {train}"
    if run.workers == 1:
        array = f"--array=0-{run.copies - 1} " if run.copies > 1 else ""
        return (f"slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch {array}-- "
                + " ".join(_flags(run)))
    ddp = run.settings["dist"] == "ddp"
    if EXPERIMENTS[name].single_node:
        env, script = "DIST=ddp " if ddp else "", "02_single_node_data_parallel"
    else:
        env, script = "LAUNCHER=srun-ddp " if ddp else "", "03_multi_node_horovod"
    return (f"{env}slurm_examples/submit.sh slurm_examples/{script}.sbatch --workers={run.workers} -- "
            + " ".join(_flags(run)))


def _flags(run: PlannedRun, keep_dist: bool = False) -> list[str]:
    # On the cluster the sbatch script chooses the launcher and --dist, the site the loaders.
    flags = train_flags(run.settings, skip={"loader_workers"} | (set() if keep_dist else {"dist"}))
    return [shlex.quote(f) for f in flags]  # printed as a shell command


def train_flags(settings: dict[str, Any], skip: set[str] = frozenset()) -> list[str]:
    """``python -m guide_utils.train`` flags for ``settings`` (TrainConfig fields), as argv items."""
    out = []
    for k, v in settings.items():
        if k in skip:
            continue
        flag = "--" + k.replace("_", "-")
        out += [flag, *map(str, v)] if isinstance(v, tuple) else [flag, str(v)]
    return out


def plan(name: str, profile: str, index: int | None = None) -> list[tuple[int, PlannedRun, str]]:
    all_runs = runs(name, profile)
    if index is not None and not 0 <= index < len(all_runs):
        raise GuideError(f"--index {index} is out of range: {name} has runs 0 to {len(all_runs) - 1}")
    chosen = range(len(all_runs)) if index is None else [index]
    return [(i, all_runs[i], launch_command(name, all_runs[i], profile, i)) for i in chosen]


def describe(run: PlannedRun, profile: str) -> str:
    """One line of what a run trains: model, data, workers x batch, learning rate, warmup, epochs."""
    from ..core.scaling import scaled_lr

    cfg = make_config("smoke" if profile == "smoke" else "full", **run.settings)
    gbatch = cfg.per_worker_batch * run.workers
    lr = scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling)
    warm = f"{cfg.warmup} warmup {cfg.warmup_epochs} epochs" if cfg.warmup != "none" else "no warmup"
    steps = f", {cfg.max_steps_per_epoch} steps" if cfg.max_steps_per_epoch else ""
    copies = f"; {run.copies} independent copies" if run.copies > 1 else ""
    return (f"{cfg.model} on {cfg.data or SITE_DATA}; {run.workers} worker(s) x {cfg.per_worker_batch} = "
            f"global batch {gbatch}; "
            f"lr {lr:g} ({cfg.lr_scaling} rule), {warm}; {cfg.epochs} epoch(s){steps}{copies}")


def print_plan(name: str, profile: str, index: int | None = None, *, commands: bool = True) -> None:
    """What ``run`` would do. With ``commands`` (``--dry-run``): each run's label, settings and
    launch command. Without: a short table, one line per run, that a notebook can show."""
    chosen = plan(name, profile, index)  # raises for an unknown name or index
    exp = EXPERIMENTS[name]
    if not commands:
        print("\n".join(plan_table(name, profile, chosen)))
        return
    print(f"{name}: {exp.title} [{exp.source}], profile {profile}, {len(chosen)} run(s)")
    if exp.note:
        print(f"note: {exp.note}")
    for i, run, command in chosen:
        print(f"[{i}] {run.label}\n    {describe(run, profile)}\n    $ {command}")


def plan_table(name: str, profile: str, chosen: list[tuple[int, PlannedRun, str]]) -> list[str]:
    """The lines of a compact plan: the experiment, what its runs share, one row per run."""
    from ..core.scaling import scaled_lr

    exp, full = EXPERIMENTS[name], runs(name, "full")
    cfgs = {i: make_config("smoke" if profile == "smoke" else "full", **run.settings) for i, run, _ in chosen}
    first = cfgs[chosen[0][0]]
    steps = f" of {first.max_steps_per_epoch} steps" if first.max_steps_per_epoch else ""
    quality = exp.kind == "quality"
    out = [f"{name}: {exp.title}", f"  {exp.source}; profile {profile}, {len(chosen)} run(s)",
           f"  each run: {first.model} on {first.data or SITE_DATA}, {first.epochs} epoch(s){steps}",
           f"  {'run':<5}{'source':<15}{'here':<18}{'global batch':>12}"
           + (f"  {'lr (rule)':<16}warmup" if quality else "")]
    for i, run, _ in chosen:
        cfg, source = cfgs[i], full[i]
        gpus = f"{source.workers} GPU x {source.settings['per_worker_batch']}"
        here = f"{run.workers} x {cfg.per_worker_batch}" + (f" {cfg.dist}" if run.workers > 1 else "")
        if source.copies > 1:
            gpus = f"{source.copies}x " + gpus  # "10x 1 GPU x 32": ten separate jobs
            here = f"{run.copies}x " + here
        gbatch = run.workers * cfg.per_worker_batch
        row = f"  {f'[{i}]':<5}{gpus:<15}{here:<18}{gbatch:>12}"
        if quality:
            lr = f"{scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling):g} ({cfg.lr_scaling})"
            row += f"  {lr:<16}" + (f"{cfg.warmup}, {cfg.warmup_epochs} epochs" if cfg.warmup != "none" else "none")
        out.append(row)
    out.append(f"  one run from a shell: python -m guide_utils experiments run {name} --profile {profile} "
               "--index I")
    return out
