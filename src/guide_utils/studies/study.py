"""Running a study: points x seeds x thread counts -> one CSV row per run.

The sweep of chapters 4-7 and the large-batch study of chapter 13 share this machinery:
each point is trained in a fresh worker process with a fixed number of CPU threads, rows
are appended to the CSV as runs finish (so an interrupted study loses at most the runs in
flight and ``resume`` carries on), and the CSV's first line says what made it, when, on
which machine, with which thread counts, commit and versions.

Why thread counts are part of a study: on a CPU the number of threads decides the order in
which a convolution's partial sums are added, and at a learning rate near the edge of
stability (the linear rule's 1.6 at k = 32) that last-bit difference can send one run down
another path. A result the guide states must hold at more than one setting, so each point is
trained at every thread count given and the CSV's ``threads`` column keeps them apart.
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing
import os
import platform
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..core.errors import GuideError


def cpu_isa() -> str:
    """The widest vector instruction set of this CPU that the math libraries use (x86), and the
    cap on it where ``ONEDNN_MAX_CPU_ISA`` or ``MKL_ENABLE_INSTRUCTIONS`` sets one."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    caps = [f"{v}={os.environ[v]}" for v in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS") if os.environ.get(v)]
    return isa + (f" (capped: {', '.join(caps)})" if caps else "")


def commit() -> str:
    """The checkout's commit, marked when it has uncommitted changes; 'unknown' outside git."""
    here = str(Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        head, dirty = "", ""
    return (head + (" with uncommitted changes" if dirty else "")) if head else "unknown (not a git checkout)"


def provenance(title: str, command: str, *, threads: Sequence[int], jobs: int) -> str:
    """A study CSV's first line: what made it, when, on what, how, from which commit and stack."""
    from importlib.metadata import version

    from ..results.plots import hardware_label

    versions = ", ".join(f"{p} {version(p)}" for p in ("torch", "timm", "mnist1d", "numpy"))
    counts = " and ".join(str(t) for t in threads)
    return (f"{title} ({command}); measured {_dt.date.today().isoformat()} on {hardware_label()}, "
            f"{cpu_isa()}; {counts} thread(s) per run, up to {jobs} core(s) busy; commit {commit()}; "
            f"Python {platform.python_version()}, {versions}")


def set_threads(threads: int) -> None:
    """Pin this process to ``threads`` CPU threads (the engine keeps an OMP_NUM_THREADS it finds)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def check_threads(threads: Iterable[int], jobs: int) -> list[int]:
    threads, cores = list(threads), os.cpu_count() or 1
    if not threads or any(t < 1 for t in threads):
        raise GuideError(f"--threads takes one or more counts of 1 or more, got {threads}")
    if not 1 <= jobs <= cores:
        raise GuideError(f"--jobs must be 1 to {cores} (the cores of this machine), got {jobs}")
    return threads


def train_all(tasks: Sequence, run: Callable, threads: int, jobs: int, report: Callable, **kwargs) -> None:
    """``run(task, **kwargs)`` for every task, each in a worker process with ``threads`` threads,
    ``max(1, jobs // threads)`` at a time; ``report(row)`` as each finishes (in finishing order)."""
    if not tasks:
        return
    workers = max(1, min(len(tasks), jobs // threads))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=set_threads, initargs=(threads,)) as pool:
        for fut in as_completed([pool.submit(run, t, **kwargs) for t in tasks]):
            report(fut.result())


class Sink:
    """The CSV a study appends to: created with its provenance line, never overwritten; with
    ``resume`` an existing one is read back and the runs it holds are not trained again."""

    def __init__(self, path: str | Path, columns: Sequence[str], header: str, *, key: Sequence[str],
                 resume: bool = False):
        self.path, self.columns, self.key_columns = Path(path), list(columns), list(key)
        self.done: set[tuple] = set()
        if self.path.exists():
            if not resume:
                raise GuideError(f"{self.path} already exists; choose another --out, or add --resume to "
                                 "finish it (results are never overwritten)")
            self._read_back()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("x", encoding="utf-8") as fh:
                fh.write(f"# {header}\n{','.join(self.columns)}\n")

    def _read_back(self) -> None:
        import csv

        with self.path.open(encoding="utf-8") as fh:
            fh.readline()
            reader = csv.DictReader(fh)
            if reader.fieldnames != self.columns:
                raise GuideError(f"{self.path} has other columns than this study writes; it cannot be resumed "
                                 "(choose another --out)")
            self.done = {self.key(row) for row in reader}

    def key(self, row: dict) -> tuple:
        """What identifies a run (its point, seed and thread count), alike for a row read back
        from the CSV and one just trained (values compare as the CSV writes them)."""
        return tuple(str(row[c]) for c in self.key_columns)

    def write(self, row: dict) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(",".join("" if row[c] is None else str(row[c]) for c in self.columns) + "\n")
        self.done.add(self.key(row))


def progress(label: str, total: int):
    """A tqdm bar on stderr for a study's runs (one update per finished run)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="run", file=sys.stderr, dynamic_ncols=True)


def outcomes(table, by: Sequence[str], reference: float, *, metric: str = "best_val_top1_err",
             within: float = 1.0, order: Sequence[str] = ()):
    """Each group's outcome as it is, not as a mean: runs, median, best and worst run, and how
    many runs ended within ``within`` points of ``reference`` (the baseline's median). A mean
    and standard deviation hide a run that diverged; these do not. Rows by k, then methods in
    ``order`` (the study's own: baseline first)."""
    g = table.groupby(list(by), sort=True)[metric]
    out = g.agg(runs="count", median="median", best="min", worst="max").reset_index()
    out["within"] = g.apply(lambda s: int((s <= reference + within).sum())).to_numpy()
    rank = {m: i for i, m in enumerate(order)}
    return out.sort_values(["k", "method"], key=lambda c: c.map(rank) if c.name == "method" and rank else c,
                           kind="stable").reset_index(drop=True)


def format_outcomes(table, *, within: float = 1.0) -> str:
    """One line per row of ``outcomes``: the point, its median, worst run and n of N near the baseline."""
    lines = []
    for row in table.itertuples():
        point = f"k={row.k:<4} {row.method:<14}" + (f" x{row.threads}" if hasattr(row, "threads") else "")
        lines.append(f"{point}  median {row.median:6.2f} %  worst {row.worst:6.2f} %  "
                     f"{row.within:>2} of {row.runs} within {within:g} point(s) of the baseline")
    return "\n".join(lines)


def env_threads() -> int:
    """OMP_NUM_THREADS as one count (its first, for a nested list like "4,2"); 1 when unset."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise GuideError(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']!r} is not a thread count; "
                         "set it to a whole number or pass --threads")
    return int(value)


def add_run_arguments(run, *, threads: Sequence[int], results_dir: str, threads_help: str) -> None:
    """The options every study's ``run`` takes: thread counts, cores, run records, resume."""
    run.add_argument("--threads", type=int, nargs="+", default=list(threads),
                     help=f"CPU threads per run; {threads_help} (default: {' '.join(map(str, threads))})")
    run.add_argument("--jobs", type=int, default=1, help="cores to keep busy (runs at a time x threads; default 1)")
    run.add_argument("--results-dir", default=results_dir, help="where the run records go")
    run.add_argument("--resume", action="store_true", help="finish an interrupted --out: train only its missing runs")


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
