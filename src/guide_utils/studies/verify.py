"""Does this machine reproduce the guide? Retrain recorded sweep points here and compare.

The quality sweep of chapters 4-7 was recorded on one machine at two thread counts. Another
CPU, thread count or a GPU adds floating-point sums in another order; at a stable learning
rate that moves a result by a few hundredths of a point, near the edge of stability (the
linear rule's 1.6 at k = 32) it can send a run down another path. So this command does not
compare one run with one recorded run. For each point it retrains, it says where the result
falls among all recorded runs of that point, and it checks the guide's conclusions, the
ranking of naive / linear / linear + warmup at each k, where the record shows a clear order:

* a *claim* is a pair of methods at one k whose recorded runs are ordered in at least
  ``CLEAR`` of all cross pairs (the probability of superiority), whose medians differ by at
  least ``study.TOLERANCE`` of the better median (the chapters' relative scale: at a 1 %
  error, half a point), and whose order the medians of n runs drawn from the record keep
  at least ``CONFIDENCE`` of the time, n being the seeds retrained here; other pairs are
  reported as on par (or too uncertain for n seeds) and not checked;
* a claim holds on this machine when the median of the retrained runs keeps the order.

``python -m guide_utils verify --quick`` retrains k = 32 (where the methods differ most):
naive and linear with one seed each, linear + warmup with four (``QUICK_SEEDS``), a few
minutes on two cores. ``--full`` retrains every point of
the sweep with every recorded seed. The exit status is 1 when a claim does not hold here.
Every run writes its run record, and the table of runs goes to ``verify.csv`` in the results
folder, with the same provenance line as the recorded sweep.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..results.plots import hardware_label
from . import study, study_csv, sweep

PROG = "python -m guide_utils verify"
CLEAR = 0.9  # share of (a, b) run pairs in which a beat b, for "a is better than b"
# Two methods are on par when their medians differ by less than study.TOLERANCE of the better
# one: relative, because the problem's errors are near 1 %, where a fixed point gap would
# mean something else at every k.
# Chance, resampling the record, that the medians of the runs retrained keep a claimed order:
# a machine that behaves like the recording fails a claim by chance less than once in fifty.
CONFIDENCE = 0.98
# --quick: k = 32, where the methods differ most, with as few runs as the claims there need
# (see ``claims``): every recorded naive run beats every linear one, so one run of each checks
# that order; linear + warmup gets four because some of its recorded runs diverged: with three,
# the median of a machine that behaves like the recording would miss its order too often, with
# four it keeps it in 99 % of draws from the record (tests/test_study.py computes it).
QUICK_KS = (32,)
QUICK_SEEDS = {"naive": (0,), "linear": (0,), "linear+warmup": (0, 1, 2, 3)}
METRIC = "best_val_top1_err"


@dataclass(frozen=True)
class Claim:
    k: int
    better: str
    worse: str
    superiority: float  # share of recorded (better, worse) run pairs that the better method won
    gap: float  # difference of the recorded medians, points
    power: float  # chance that the order of n-run medians holds, resampling the record

    def __str__(self) -> str:
        return f"k={self.k}: {self.better} better than {self.worse}"


def superiority(a, b) -> float:
    """Share of pairs (x from a, y from b) with x < y, ties counted half (lower error is better)."""
    pairs = [(x < y) + 0.5 * (x == y) for x in a for y in b]
    return sum(pairs) / len(pairs)


def median_order_chance(a, b, n_a: int, n_b: int | None = None, draws: int = 4000) -> float:
    """How often the median of ``n_a`` runs drawn from ``a`` (with replacement) is below that
    of ``n_b`` drawn from ``b``: the chance that a machine behaving like the recording sees
    the order with that many seeds. A fixed random seed keeps the answer the same everywhere."""
    import numpy as np

    rng = np.random.default_rng(0)
    ma = np.median(rng.choice(np.asarray(a, float), size=(draws, n_a)), axis=1)
    mb = np.median(rng.choice(np.asarray(b, float), size=(draws, n_b or n_a)), axis=1)
    return float(np.mean(ma < mb))


def claims(table, ks=None, n: int | dict = 3) -> list[Claim]:
    """The orders of methods the recorded sweep shows at each k firmly enough to be checked
    with ``n`` seeds per method (a number, or one per method): the better method wins at least
    ``CLEAR`` of all recorded run pairs, the medians lie at least ``study.TOLERANCE`` of the
    better median apart, and resampling the record, the medians of that many runs keep the
    order at least ``CONFIDENCE`` of the time (so a machine that behaves like the recording
    fails a claim by chance less than once in fifty)."""
    seeds = n if isinstance(n, dict) else {m: n for m in sweep.METHODS}
    out = []
    for k in sorted(set(table["k"]) - {1} if ks is None else ks):
        at_k = table[table["k"] == k]
        runs = {m: at_k[at_k["method"] == m][METRIC].tolist() for m in sweep.METHODS}
        for i, a in enumerate(sweep.METHODS):
            for b in list(sweep.METHODS)[i + 1:]:
                if not runs[a] or not runs[b]:
                    continue
                p = superiority(runs[a], runs[b])
                better, worse, p = (a, b, p) if p >= 0.5 else (b, a, 1 - p)
                gap = _median(runs[worse]) - _median(runs[better])
                power = median_order_chance(runs[better], runs[worse], seeds[better], seeds[worse])
                if p >= CLEAR and gap >= study.TOLERANCE * _median(runs[better]) and power >= CONFIDENCE:
                    out.append(Claim(int(k), better, worse, round(p, 3), round(gap, 2), round(power, 3)))
    return out


def recorded_range(recorded) -> str:
    """A recorded point's runs in a few words: median, range and count."""
    recorded = sorted(recorded)
    return f"median {_median(recorded):.2f} %, {recorded[0]:.2f} to {recorded[-1]:.2f} %, {len(recorded)} runs"


def position(value: float, recorded) -> str:
    """Where ``value`` falls among the recorded runs of the same point, in a few words."""
    recorded = sorted(recorded)
    if value < recorded[0]:
        return "below every recorded run"
    if value > recorded[-1]:
        return "above every recorded run"
    return f"rank {sum(v < value for v in recorded) + 1} of {len(recorded) + 1} with the recorded runs"


def _median(values) -> float:
    import statistics

    return float(statistics.median(values))


def check(claim: Claim, mine) -> tuple[bool, str]:
    """Does ``claim`` hold among this machine's runs (a table like the sweep's)?"""
    at_k = mine[mine["k"] == claim.k]
    a, b = (at_k[at_k["method"] == m][METRIC] for m in (claim.better, claim.worse))
    if a.empty or b.empty:
        return True, f"{claim}: not retrained here"
    ok = a.median() < b.median()
    return ok, (f"{claim}: {'holds' if ok else 'DOES NOT HOLD'} here (median {a.median():.2f} vs "
                f"{b.median():.2f} %)\n      recorded: medians {claim.gap:.2f} points apart, ordered in "
                f"{claim.superiority:.0%} of run pairs")


def plan(quick: bool, recorded) -> list[sweep.Point]:
    if quick:
        return [sweep.Point(k, m, s) for k in QUICK_KS for m in sweep.METHODS for s in QUICK_SEEDS[m]]
    seeds = sorted(set(recorded["seed"]))
    return sweep.points(sweep.KS, seeds)


def report(mine, recorded) -> tuple[list[str], bool]:
    """The lines to print and whether every recorded claim holds here."""
    lines = ["Each run of this machine among the recorded runs of its point (best top-1 validation error):"]
    for (k, method), runs in mine.sort_values(["k", "method", "seed"]).groupby(["k", "method"], sort=True):
        same = recorded[(recorded["k"] == k) & (recorded["method"] == method)][METRIC]
        lines.append(f"  k={k} {method} (recorded: {recorded_range(same)})")
        for row in runs.itertuples():
            value = getattr(row, METRIC)
            lines.append(f"    seed {row.seed}: {value:6.2f} %  {position(value, same)}")
    ks = sorted(set(mine["k"]) - {1})
    counts = mine[mine["k"] > 1].groupby(["k", "method"]).size().groupby("method").min()
    n = {m: int(counts.get(m, 0)) or 1 for m in sweep.METHODS}
    found = claims(recorded, ks, n)
    lines.append(f"The guide's conclusions at k = {', '.join(map(str, ks))} that these runs can check "
                 "(orders the record shows firmly):")
    ok_all = True
    for claim in found:
        ok, line = check(claim, mine)
        ok_all &= ok
        lines.append("  " + line)
    loose = [f"k={k} {a} / {b}" for k in ks for i, a in enumerate(sweep.METHODS) for b in list(sweep.METHODS)[i + 1:]
             if not any(c.k == k and {c.better, c.worse} == {a, b} for c in found)]
    if loose:
        lines.append(f"  not checked, their recorded order not firm enough: {'; '.join(loose)}")
    return lines, ok_all


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="k = 32, every method, 1 to 5 seeds (default; minutes on 2 cores)")
    size.add_argument("--full", action="store_true", help="every point of the recorded sweep, every seed")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per run (default: OMP_NUM_THREADS, else 1)")
    p.add_argument("--jobs", type=int, default=None, help="cores to keep busy (default: all of them)")
    p.add_argument("--results-dir", default=None,
                   help="where run records and verify.csv go (default: results/verify-DATE-TIME; must be new)")
    return p


def retrain(results: str | Path, *, full: bool = False, threads: int = 1, jobs: int = 1, progress: bool = True,
            command: str = f"{PROG} --quick"):
    """Retrain the recorded points (``--quick``'s or, with ``full``, all) into ``results``
    (which must be new or empty): the table of this machine's runs, also in ``verify.csv``."""
    results = Path(results)
    if results.exists() and any(results.iterdir()):
        raise GuideError(f"{results} already holds files; choose a new --results-dir (nothing is overwritten)")
    pts = plan(not full, sweep.recorded())
    return sweep.run(pts, results, results / "verify.csv", threads=[threads], jobs=jobs, command=command,
                     title="the guide's sweep points retrained", progress=progress)


def verdict(ok: bool) -> str:
    return ("verdict: the guide's conclusions hold on this machine" if ok else
            "verdict: a conclusion of the guide does not hold on this machine (see above)")


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    threads = args.threads if args.threads is not None else study.env_threads()
    jobs = args.jobs or os.cpu_count() or 1
    results = Path(args.results_dir or f"results/verify-{_dt.datetime.now():%Y%m%d-%H%M%S}")
    recorded = sweep.recorded()
    print(f"recorded: {recorded.attrs['source']}", flush=True)
    print(f"this machine: {hardware_label()}, {study_csv.cpu_isa()}, {threads} thread(s) per run, up to {jobs} "
          f"core(s); run records and verify.csv in {results}", flush=True)
    mine = retrain(results, full=args.full, threads=threads, jobs=jobs, command=" ".join([PROG, *argv]))
    lines, ok = report(mine, recorded)
    print("\n".join(lines))
    print(verdict(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
