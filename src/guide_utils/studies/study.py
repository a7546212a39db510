"""A study: points x seeds x thread counts -> one row per run -> a summary.

The quality sweep of chapters 4-7, the large-batch study of chapter 13 and the thesis's nine
experiments are each a :class:`Study`, a page of declarations: the columns of its table, which
of them identify a run, how a trained point becomes a row, its thread counts and its summary.
Its points are the study's own small dataclasses; each makes its ``TrainConfig``
(``point.config(**overrides)``) and names its key columns (``point.key()``). ``Study.run``
trains every point at every thread count, each in a fresh worker process with that many
threads (``studies.workers`` says why), ``jobs`` cores busy; rows are appended to the CSV as
runs finish (so an interrupted study loses at most the runs in flight, and ``resume``
carries on), and the CSV's first line says what made it, when, on which machine, with which
thread counts, commit and versions (``study_csv.provenance``). A study without thread counts
(the experiments) trains its points in this process, at the launcher's count.

Summaries show each point's outcome as it is: median, best and worst run, and how many runs
ended near the baseline (``outcomes``), not a mean and standard deviation, which hide a run
that diverged. The baseline is what the study declares (``reference``: the runs whose columns
hold the given values, the sweeps' ``method = baseline``), and so is the number compared
(``metric``, an error in %). "Near" is relative and comes from the baseline's own runs: at
most its worst run, (1 + ``draws.tolerance``) x its median, a limit that scales with the
problem (an absolute point is a 4 % change on ImageNet's 25 % error and more than the whole
error of a problem below 1 %) and is each study's own (the book's methods page says why).
Every run a summary counts is a draw of its own: a point that holds one seed at several
thread counts is summarised per thread count (``draws``).

A study is also a command, ``python -m guide_utils NAME``: the module that declares it as
``STUDY`` (with its ``help`` line) is found by ``studies.registry``. A study that declares
``arguments`` (its points' options) and ``plan`` (the parsed options -> its points) needs no
command code of its own: :meth:`Study.main` is its ``run`` (``--dry-run`` lists the runs) and
``summary CSV``.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from . import draws, study_csv
from .workers import check_threads, train_all, train_here, train_point

METRIC = "best_val_top1_err"  # what the summaries compare: the best top-1 error, as the thesis reports
BASELINE = (("method", "baseline"),)  # the sweeps' reference runs: (column, value) pairs they all hold
PROG = "python -m guide_utils"


@dataclass(frozen=True)
class Study:
    name: str  # in messages and on the progress bar: "sweep"
    title: str  # the provenance line's first words: "MNIST-1D quality sweep"
    command: str  # what writes its CSV: "python -m guide_utils sweep run"
    columns: tuple[str, ...]  # of its CSV, in order
    key: tuple[str, ...]  # the columns that identify a run ("threads" among them where counts are fixed)
    # (point, cfg, result) -> the run's row; module-level, so that spawned workers find it by name
    row: Callable[[Any, Any, Any], dict]
    threads: tuple[int, ...] = ()  # the default counts; (): in this process, at the launcher's count
    summary: Callable[[Any], str] | None = None  # the table's summary (default: ``format_outcomes``)
    describe: Callable[[dict], str] | None = None  # a finished run in a few words, for the progress bar
    order: tuple[str, ...] = ()  # the values of its text column (methods) in the summaries' order, baseline first
    text_columns: tuple[str, ...] = ()  # read back as text, not numbers (the curves)
    by: tuple[str, ...] = ()  # the columns a summary groups runs by (default: the key's but seed and threads)
    runs: Callable[[Any], Any] | None = None  # the table -> the runs its summary reads (default: all)
    metric: str = METRIC  # the column the summary compares, an error in %: lower is better
    reference: tuple[tuple[str, Any], ...] = BASELINE  # the baseline: the runs whose columns hold these values
    # The command, ``python -m guide_utils NAME`` (``studies.registry`` finds the module's ``STUDY``):
    help: str = ""  # its line in ``python -m guide_utils --help``, and its description
    arguments: Callable[[Any], None] | None = None  # adds the options that choose its points to ``run``
    plan: Callable[[Any], list] | None = None  # the parsed options -> the points ``run`` trains

    def open(self, out: str | Path | None = None, **options) -> Session:
        """A run of this study into ``out`` (None: no CSV); see :class:`Session` for ``options``."""
        return Session(self, out, **options)

    def run(self, points: Sequence, out: str | Path | None = None, *, overrides: dict | None = None,
            **options):
        """Train every point at every thread count, appending rows to ``out`` as they finish
        (with ``resume`` the runs ``out`` holds are skipped); the table of ``out``, or of this
        call's runs without one. ``overrides`` change every run's settings (``results_dir``;
        tests shrink the problem with them)."""
        with self.open(out, **options) as session:
            session.train(points, overrides=overrides)
        return session.table()

    def load(self, path: str | Path):
        """A CSV this study wrote; ``.attrs['source']`` keeps its first line (date, hardware)."""
        return study_csv.read(path, what=self.name, command=self.command, columns=self.columns,
                              dtype={c: str for c in self.text_columns} or None)

    def outcomes(self, table, tolerance: float | None = None, by: Sequence[str] | None = None):
        """``outcomes`` of the study's runs in ``table``, grouped by ``by`` (default: the
        declared ``by``; any columns, ``threads`` among them), against the median of its
        declared ``reference`` runs (its baseline), with their own ``draws.tolerance`` unless
        one is given. A table that holds one seed of a point at several thread counts is
        judged per thread count, each against its own baseline (one seed is one draw)."""
        runs = self.runs(table) if self.runs else table
        by = list(by or self.by or [c for c in self.key if c not in ("seed", "threads")])
        if "threads" in runs.columns and "threads" not in by and draws.repeated(runs, by):
            import pandas as pd

            parts = [self._judge(part, by, tolerance).assign(threads=t) for t, part in runs.groupby("threads")]
            out = pd.concat(parts, ignore_index=True)
            return _ordered(out[[*by, "threads", *(c for c in out.columns if c not in [*by, "threads"])]],
                            [*by, "threads"], self.order)
        return self._judge(runs, by, tolerance)

    def _judge(self, runs, by: list[str], tolerance: float | None):
        draws.check(runs, by, f"the {self.name} table")
        base = reference_runs(runs, self.reference, self.metric)
        return outcomes(runs, by, float(base.median()), metric=self.metric, order=self.order,
                        tolerance=draws.tolerance(base) if tolerance is None else tolerance)

    def format(self, outcomes) -> str:
        """The summary's lines (``format_outcomes``)."""
        return format_outcomes(outcomes)

    def report(self, table) -> str:
        """What the command prints: the CSV's first line (where there is a CSV), then the summary."""
        summary = self.summary(table) if self.summary else self.format(self.outcomes(table))
        source = table.attrs.get("source")
        return f"{source}\n{summary}" if source else summary

    def parser(self, prog: str, description: str, *, run_help: str, points: Callable[[Any], None],
               results_dir: str, threads_help: str, out_required: bool = False,
               dry_run: bool = False) -> ArgumentParser:
        """A study's command: ``run`` (``points`` adds the study's own options), and ``summary CSV``."""
        p = ArgumentParser(prog=prog, description=description)
        sub = p.add_subparsers(dest="command", required=True)
        r = sub.add_parser("run", help=run_help)
        points(r)
        r.add_argument("--out", required=out_required,
                       help="CSV of the results (must not exist yet, unless --resume)")
        add_run_arguments(r, threads=self.threads, results_dir=results_dir, threads_help=threads_help)
        if dry_run:
            r.add_argument("--dry-run", action="store_true", help="list the runs and train nothing")
        s = sub.add_parser("summary", help=f"medians, worst runs and counts of a {self.name} CSV")
        s.add_argument("csv")
        return p

    def cli(self, args, run: Callable[[Any], Any]) -> int:
        """A study command's body: ``summary`` loads the CSV, ``run`` calls ``run(args)``; then the report."""
        if args.command == "summary":
            table = self.load(args.csv)
        else:
            if args.resume and not args.out:
                raise GuideError("--resume needs --out, the CSV to finish")
            table = run(args)
        print(self.report(table))
        return 0

    def main(self, argv: list[str] | None = None, *, overrides: dict | None = None) -> int:
        """The command of a study that declares ``arguments`` and ``plan``: ``run`` trains every
        point of the plan at every thread count (``--dry-run``: lists the runs), ``summary CSV``
        reads a CSV back; then the report. ``overrides`` change every run's settings (tests
        shrink the problem with them)."""
        return one_line_errors(f"{PROG} {self.name}")(functools.partial(self._main, overrides=overrides))(argv)

    def _main(self, argv: list[str] | None, overrides: dict | None) -> int:
        if self.arguments is None or self.plan is None:
            raise TypeError(f"the {self.name} study declares no arguments and plan; give it a main of its own")
        prog, argv = f"{PROG} {self.name}", list(sys.argv[1:] if argv is None else argv)
        args = self.parser(prog, self.help, run_help=f"train every point of the {self.name} study",
                           points=self.arguments, results_dir=f"results/{self.name}",
                           threads_help="every point is trained at each", dry_run=True).parse_args(argv)
        if args.command == "run" and args.dry_run:
            print(self.listing(self.plan(args), args.threads))
            return 0
        return self.cli(args, lambda a: self.run(
            self.plan(a), a.out, threads=a.threads, jobs=a.jobs, resume=a.resume, command=" ".join([prog, *argv]),
            overrides={"results_dir": a.results_dir, **(overrides or {})}))

    def listing(self, points: Sequence, threads: Sequence[int]) -> str:
        """The runs of ``points`` at ``threads`` in a few lines: their count, then one point a line."""
        counts = " and ".join(map(str, threads)) or "the launcher's"
        lines = [f"{self.title}: {len(points)} point(s) x {len(threads) or 1} thread count(s) ({counts}) = "
                 f"{len(points) * (len(threads) or 1)} run(s)"]
        return "\n".join(lines + ["  " + " ".join(f"{k}={v}" for k, v in p.key().items()) for p in points])


class Session:
    """One run of a study: its CSV (or none), thread counts, cores busy and progress bar.
    ``train`` may be called more than once (the large-batch study tunes, reads back what the
    tuning chose, then trains the rest into the same CSV); use it as a context manager."""

    def __init__(self, study: Study, out: str | Path | None = None, *, threads: Sequence[int] | None = None,
                 jobs: int = 1, resume: bool = False, command: str | None = None, title: str | None = None,
                 progress: bool = True):
        self.study, self.out, self.jobs, self.rows = study, out, jobs, []
        counts = study.threads if threads is None else threads
        self.threads = check_threads(counts, jobs) if counts else []
        self.sink = None
        if out is not None:
            if not self.threads:
                raise ValueError(f"the {study.name} study has no thread counts to record in {out}")
            header = study_csv.provenance(title or study.title, command or study.command, threads=self.threads,
                                          jobs=jobs)
            self.sink = study_csv.Sink(out, study.columns, header, key=study.key, resume=resume)
        self.bar = _progress(study.name) if progress else None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def missing(self, points: Sequence, threads: int | None) -> list:
        """The points not yet in the CSV at ``threads`` (all of them without a CSV)."""
        if self.sink is None:
            return list(points)
        return [p for p in points if self.sink.key({**p.key(), "threads": threads}) not in self.sink.done]

    def train(self, points: Sequence, *, threads: Sequence[int] | None = None, overrides: dict | None = None):
        """Train the missing ``points`` at each of ``threads`` (default: the session's)."""
        kwargs = {"row": self.study.row, **(overrides or {})}
        for t in (self.threads if threads is None else list(threads)) or [None]:
            todo = self.missing(points, t)
            if self.bar is not None:
                self.bar.total += len(todo)
                self.bar.refresh()
            if t is None:
                train_here(todo, train_point, self._report, **kwargs)
            else:
                train_all(todo, train_point, t, self.jobs, self._report, **kwargs)

    def _report(self, row: dict) -> None:
        self.rows.append(row)
        if self.sink is not None:
            self.sink.write(row)
        if self.bar is not None:
            self.bar.update()
            if self.study.describe is not None:
                self.bar.set_postfix_str(self.study.describe(row))

    def table(self):
        """The CSV's table (every run it holds), or this session's runs without a CSV."""
        import pandas as pd

        if self.out is not None:
            return self.study.load(self.out)
        return pd.DataFrame(self.rows, columns=list(self.study.columns))


def _progress(label: str):
    """A tqdm bar on stderr for a study's runs (one update per finished run)."""
    from tqdm import tqdm

    return tqdm(total=0, desc=label, unit="run", file=sys.stderr, dynamic_ncols=True)


def quality(cfg, result, workers: int = 1) -> dict:
    """What a quality row records of a trained run: its global batch and peak learning rate,
    its best and final top-1 validation error (the thesis reports the best) and its wall time."""
    from ..core.scaling import scaled_lr

    errs = [e["val_top1_err"] for e in result.epochs]
    gbatch = cfg.per_worker_batch * workers
    return {"global_batch": gbatch, "peak_lr": scaled_lr(cfg.base_lr, cfg.base_batch, gbatch, rule=cfg.lr_scaling),
            "best_val_top1_err": round(min(errs), 3), "final_val_top1_err": round(errs[-1], 3),
            "seconds": round(sum(e["seconds"] for e in result.epochs), 1)}


def reference_runs(table, reference: Sequence[tuple[str, Any]] = BASELINE, metric: str = METRIC):
    """The baseline's values of ``metric``: the runs whose columns hold the values of
    ``reference`` (the sweeps': ``method = baseline``)."""
    chosen = True
    for column, value in reference:
        chosen = chosen & (table[column] == value)
    base = table[chosen][metric]
    if base.empty:
        where = ", ".join(f"{c} = {v}" for c, v in reference)
        raise GuideError(f"the table has no baseline runs ({where}) to judge the others against; train them too")
    return base


def reference_median(table, reference: Sequence[tuple[str, Any]] = BASELINE, metric: str = METRIC) -> float:
    """The value every point is judged against: the median of ``reference_runs``."""
    return float(reference_runs(table, reference, metric).median())


def outcomes(table, by: Sequence[str], reference: float, *, tolerance: float, metric: str = METRIC,
             order: Sequence[str] = ()):
    """Each group's outcome as it is, not as a mean: runs, median, best and worst run, and how
    many runs ended near the baseline, at most ``limit`` = (1 + ``tolerance``) x ``reference``
    (the baseline's median; ``limit`` and ``tolerance`` are columns too; a study takes its
    baseline's own, ``draws.tolerance``). Rows sorted by ``by``, the values of its text
    columns (methods) in ``order`` (the study's own: baseline first)."""
    by = list(by)
    limit = round((1 + tolerance) * reference, 9)  # the baseline's worst run exactly, not one ulp below it
    g = table.groupby(by, sort=True)[metric]
    out = g.agg(runs="count", median="median", best="min", worst="max").reset_index()
    out["within"] = g.apply(lambda s: int((s <= limit).sum())).to_numpy()
    out["limit"], out["tolerance"] = limit, tolerance
    return _ordered(out, by, order)


def _ordered(out, by: list[str], order: Sequence[str]):
    """``out`` sorted by ``by``, the values of its text columns (methods) in ``order``."""
    rank = {m: i for i, m in enumerate(order)}
    return out.sort_values(by, key=lambda c: c.map(rank) if rank and c.isin(list(rank)).any() else c,
                           kind="stable").reset_index(drop=True)


def format_outcomes(table) -> str:
    """One line per row of ``outcomes``: its group (every column before ``runs``: a text value,
    a method, as it is, a number as ``column=value``), median, worst run and n of N near the
    baseline, with the limit that means ((1 + tolerance) x its median)."""
    by = list(table.columns[:list(table.columns).index("runs")])
    lines = []
    for row in table.to_dict("records"):
        point = " ".join(f"{row[c]:<14}" if isinstance(row[c], str) else f"{c}={row[c]!s:<4}" for c in by)
        lines.append(f"{point}  median {row['median']:6.2f} %  worst {row['worst']:6.2f} %  "
                     f"{row['within']:>2} of {row['runs']} near the baseline (<= {row['limit']:.2f} %)")
    return "\n".join(lines)


def band(recorded, widen: float = 2.0) -> tuple[float, float]:
    """The values a new run of a recorded point may take and still agree with the record: the
    range of the recorded runs widened by ``widen`` of their standard deviations on each side.
    The range grows with the number of runs and the widening with their spread, so a stable
    point gets a narrow band and a point whose runs sometimes diverge a wide one."""
    import statistics

    values = [float(v) for v in recorded]
    if len(values) < 2:
        raise GuideError(f"a band needs at least 2 recorded runs, got {len(values)}")
    sd = statistics.stdev(values)
    return min(values) - widen * sd, max(values) + widen * sd


def agrees(value: float, recorded, widen: float = 2.0) -> bool:
    """Does one new run agree with the recorded runs of its point (see ``band``)?"""
    lo, hi = band(recorded, widen)
    return lo <= float(value) <= hi


def env_threads() -> int:
    """OMP_NUM_THREADS as one count (its first, for a nested list like "4,2"); 1 when unset."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise GuideError(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']!r} is not a thread count; "
                         "set it to a whole number or pass --threads")
    return int(value)


def add_point_arguments(run, *, ks: Sequence[int], seeds: Sequence[int], methods: Sequence[str]) -> None:
    """The options that choose a sweep-like study's points: scaling factors, seeds, methods."""
    run.add_argument("--ks", type=int, nargs="+", default=list(ks),
                     help=f"scaling factors (default: {' '.join(map(str, ks))})")
    run.add_argument("--seeds", type=int, nargs="+", default=list(seeds),
                     help=f"seeds per point (default: {seeds[0]} to {seeds[-1]})")
    run.add_argument("--methods", nargs="+", default=list(methods), help=", ".join(methods))


def add_list_argument(run, flag: str, values: Sequence, help: str, type: Callable = int) -> None:
    """``flag V [V ...]``: the values one of a study's point columns takes (its help names the default)."""
    run.add_argument(flag, type=type, nargs="+", default=list(values),
                     help=f"{help} (default: {' '.join(map(str, values))})")


def smoke_config(settings: dict, label: dict):
    """A laptop-scale point's ``TrainConfig``: the smoke profile with ``settings``; ``label``
    (which study and point: ``{"sweep": point.key()}``) goes into its run record's ``extra``."""
    from ..core.config import make_config

    cfg = make_config("smoke", **settings)
    cfg.extra = label
    return cfg


def add_run_arguments(run, *, threads: Sequence[int], results_dir: str, threads_help: str) -> None:
    """The options every study's ``run`` takes: thread counts, cores, run records, resume."""
    run.add_argument("--threads", type=int, nargs="+", default=list(threads),
                     help=f"CPU threads per run; {threads_help} (default: {' '.join(map(str, threads))})")
    run.add_argument("--jobs", type=int, default=1, help="cores to keep busy (runs at a time x threads; default 1)")
    run.add_argument("--results-dir", default=results_dir, help="where the run records go")
    run.add_argument("--resume", action="store_true", help="finish an interrupted --out: train only its missing runs")
