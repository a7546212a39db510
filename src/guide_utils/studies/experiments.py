"""The thesis's nine experiments, and the SLICES slides' benchmark, as named, parameterised
runs at two scales.

``python -m guide_utils experiments list|run NAME --profile smoke|full [--index I] [--dry-run]``

The experiments, their runs at each scale and how each run is started are
:mod:`guide_utils.studies.experiment_plans`; this module trains them, and its names are the
door the notebooks and scripts use.

``run`` trains an experiment's runs as one :class:`~guide_utils.studies.study.Study`, the way
the sweep and the large-batch study train theirs, but in this process: a multi-worker run's
processes are started by its launcher (``launch``, ``torchrun``, ``horovodrun``, an sbatch
script), each runs the same runs, and every run must fit the launch before any starts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.cli import ArgumentParser, one_line_errors
from ..core.config import make_config
from ..core.errors import GuideError
from .experiment_plans import (EXPERIMENTS, PROG, SMOKE_BATCH, SMOKE_WARMUP, PlannedRun, describe, plan, print_plan,
                               runs, train_flags)
from .study import Study

# Public names, the plan's among them: notebooks and tests call experiments.plan and .describe too.
__all__ = ["EXPERIMENTS", "SMOKE_BATCH", "SMOKE_WARMUP", "STUDY", "ExperimentRun", "PlannedRun", "describe",
           "execute", "launch", "main", "plan", "print_plan", "runs", "train_flags"]


def _world_size() -> int:
    from ..runtime import launchers

    launcher = launchers.detect()
    return launcher.world_size if launcher is not None else 1


@dataclass(frozen=True)
class ExperimentRun:
    """One planned run of an experiment as a point of the experiments' study."""

    name: str
    index: int
    run: PlannedRun
    profile: str

    def key(self) -> dict:
        return {"experiment": self.name, "index": self.index}

    def config(self, **overrides: Any):
        settings = {**self.run.settings, **overrides}
        settings["run_name"] = overrides.get("run_name") or f"{self.name}-{self.profile}-run{self.index}"
        cfg = make_config("smoke" if self.profile == "smoke" else "full", **settings)
        cfg.extra = {"experiment": self.name, "run_index": self.index, "label": self.run.label}
        if self.run.copies > 1:
            cfg.extra["copies"] = self.run.copies
        return cfg


def row(point: ExperimentRun, cfg, result) -> dict:
    """A finished run in the experiments' table: what it was, how it ended, where its record is
    (None on the ranks that write none)."""
    from ..core.scaling import scaled_lr

    gbatch = cfg.per_worker_batch * point.run.workers
    rates = [e["images_per_second"] for e in result.epochs if e.get("images_per_second")]
    return {**point.key(), "label": point.run.label, "workers": point.run.workers, "global_batch": gbatch,
            "peak_lr": scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling),
            "best_val_top1_err": round(min(e["val_top1_err"] for e in result.epochs), 3) if result.epochs else None,
            "images_per_second": round(rates[-1], 1) if rates else None,
            "seconds": round(sum(e["seconds"] for e in result.epochs), 1), "run_name": result.run_name,
            "record": result.record_path}


def summary(table) -> str:
    return "\n".join(f"[experiments] {r.run_name}: record {r.record}" for r in table.itertuples())


COLUMNS = ("experiment", "index", "label", "workers", "global_batch", "peak_lr", "best_val_top1_err",
           "images_per_second", "seconds", "run_name", "record")
# No thread counts: every run trains in the process(es) its launcher started, at their count.
STUDY = Study("experiments", "the thesis's experiments", f"{PROG} run", COLUMNS, ("experiment", "index"), row,
              summary=summary, help="the thesis's nine experiments: list, run, --dry-run")


def execute(name: str, profile: str, index: int | None = None, **overrides: Any):
    """Train the chosen runs through the engine in this process, the experiments' study (each
    writes its run record): the table of runs, one row each. Every run must fit this launch."""
    chosen = plan(name, profile, index)
    size = _world_size()
    for i, run, command in chosen:
        if size != run.workers:
            raise GuideError(f"{name} run {i} ({run.label}) needs {run.workers} worker(s) but this launch has "
                             f"{size}; start it as: {command}")
    return STUDY.run([ExperimentRun(name, i, run, profile) for i, run, _ in chosen], progress=False,
                     overrides=overrides)


def launch(name: str, index: int, profile: str = "smoke", *, results_dir: str = "results",
           launcher: str | None = None, quiet: bool = True):
    """Run one run of ``name`` on this machine with as many processes as it needs; its record path.

    One-worker runs train in this process; multi-worker runs start their workers with
    ``launcher`` (default: ``horovodrun`` for Horovod runs, ``torchrun`` for DDP runs), each
    worker running ``python -m guide_utils experiments run NAME --index I``. ``quiet``: print
    nothing while training (a notebook prints one table from the records afterwards); else
    rank 0's line per epoch.
    """
    from ..runtime import launch as _launch
    from ..runtime import launchers
    from ..core.records import read_runs

    [(i, run, command)] = plan(name, profile, index)
    if run.copies > 1:
        raise GuideError(f"{name} run {i} is {run.copies} separate jobs, not one launch; start them as: {command}")
    if profile == "full":  # one GPU per worker, all on this node: a larger run is a job of its own
        import torch

        gpus = torch.cuda.device_count()
        if run.workers > gpus:
            raise GuideError(f"{name} run {i} ({run.label}) needs {run.workers} worker(s) with a GPU each, but this "
                             f"node has {gpus}; submit it as a job instead: {command}")
    if run.workers == 1:  # no progress bar in a notebook
        return execute(name, profile, index, results_dir=results_dir, progress=False, quiet=quiet)["record"].iloc[0]
    able = launchers.starting(run.settings["dist"])  # the local launchers for its backend, usual one first
    launcher = launcher or able[0]
    if launcher not in able:
        raise GuideError(f"{name} run {i} uses --dist {run.settings['dist']}: launch it with {' or '.join(able)}")
    before = {r.path for r in read_runs(results_dir)} if Path(results_dir).is_dir() else set()
    _launch.run(launcher, run.workers, "guide_utils",
                ["experiments", "run", name, "--profile", profile, "--index", str(i),
                 "--results-dir", str(results_dir)], echo=None if quiet else "[train]")
    new = [r.path for r in read_runs(results_dir) if r.path not in before]
    if len(new) != 1:
        raise GuideError(f"{name} run {i}: expected one new run record in {results_dir}, found {len(new)}")
    return new[0]


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the experiments and their runs")
    r = sub.add_parser("run", help="run an experiment (or one of its runs with --index)")
    r.add_argument("name", help="exp1 ... exp9, slices")
    r.add_argument("--profile", choices=["smoke", "full"], default="smoke")
    r.add_argument("--index", type=int, help="only this run (0-based; for job arrays: $SLURM_ARRAY_TASK_ID)")
    r.add_argument("--dry-run", action="store_true", help="print the runs and how to start each; run nothing")
    r.add_argument("--results-dir", help="where the run records go (default: results)")
    r.add_argument("--data", help="dataset (default: the profile's)")
    r.add_argument("--epochs", type=int, help="train only the first N epochs of each run: a quick look at the "
                                              "start of every curve before spending the whole allocation")
    return p


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        for exp in EXPERIMENTS.values():
            print(f"{exp.name}  {exp.title}  [{exp.source}]")
            for i, run in enumerate(runs(exp.name, "full")):
                print(f"    {i}: {run.label}")
        return 0
    if args.dry_run:
        print_plan(args.name, args.profile, args.index)
        return 0
    overrides = {k: v for k, v in (("results_dir", args.results_dir), ("data", args.data), ("epochs", args.epochs))
                 if v is not None}
    print(STUDY.report(execute(args.name, args.profile, args.index, **overrides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
