"""Does this machine reproduce the guide? Train sweep points here with new seeds and compare.

The quality sweep of chapters 4-7 was recorded on one machine, ten seeds per point, each seed
one draw. Another CPU, thread count or a GPU adds floating-point sums in another order; at a
stable learning rate that moves a result by a few hundredths of a point, near the edge of
stability (the linear rule's 1.6 at k = 32) it can send a run down another path. So this
command does not compare one run with one recorded run, and it does not replay a recorded
seed (that would be the recorded draw again, not a new one): it trains seeds the record does
not hold (``draws.new_seeds``), says where each result falls among all recorded runs of its
point, and checks the guide's conclusions, the ranking of naive / linear / linear + warmup at
each k, where the record shows a clear order:

* a *claim* is a pair of methods at one k whose recorded draws are ordered in at least
  ``CLEAR`` of all cross pairs (the probability of superiority), whose medians differ by at
  least the baseline's own relative spread (``draws.tolerance``, the chapters' yardstick for
  "near the baseline"), and whose order the medians of n draws resampled from the record
  keep at least ``CONFIDENCE`` of the time, n being the runs trained here; other pairs are
  reported as on par (or too uncertain for n runs) and not checked;
* a claim holds on this machine when the median of its new runs keeps the order.

``python -m guide_utils verify --quick`` trains k = 32 (where the methods differ most) with
``QUICK_RUNS`` new seeds per method, a few minutes on two cores; ``--full`` trains every point
of the sweep with ``FULL_RUNS`` new seeds. The exit status is 1 when a claim does not hold
here. Every run writes its run record, and the table of runs goes to ``verify.csv`` in the
results folder, with the same provenance line as the recorded sweep.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..results.plots import hardware_label
from . import draws, study, study_csv, sweep

PROG = "python -m guide_utils verify"
CLEAR = 0.9  # share of (a, b) run pairs in which a beat b, for "a is better than b"
# Two methods are on par when their medians differ by less than the baseline's relative spread
# (draws.tolerance) of the better one: relative, because the problem's errors are near 1 %,
# where a fixed point gap would mean something else at every k.
# Chance, resampling the record, that the medians of the runs retrained keep a claimed order:
# a machine that behaves like the recording fails a claim by chance less than once in fifty, as
# estimated from the record's ten draws per point (which pin the distribution down only loosely).
CONFIDENCE = 0.98
# --quick: k = 32, where the methods differ most, with the fewest new runs that check both
# orders against the linear rule alone: one of naive (every recorded naive draw beat every
# linear one) and of linear; three of linear + warmup. One of its ten recorded draws diverged
# and ended behind a linear draw; resampling the record, one warmup run would keep the order
# often enough, but then one diverged run decides the check, and the resampled chance cannot
# see how far such a run can end. Three make the median their middle run: one diverged run
# cannot decide it. The third firm order, warmup better than naive, rests on that one
# diverged draw in ten: checking it needs five warmup runs (resampled power 0.993, four give
# 0.949), seven runs in all, more than the six --quick took before; --full checks it.
# tests/test_study.py computes all of it from the record.
QUICK_KS = (32,)
QUICK_RUNS = {"naive": 1, "linear": 1, "linear+warmup": 3}
FULL_RUNS = 5  # --full: new seeds per point of the sweep
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


def orders(table, ks=None, on_par: float | None = None) -> list[Claim]:
    """The orders of methods the recorded sweep shows firmly at each k (every k but 1 unless
    ``ks``): the better method wins at least ``CLEAR`` of all recorded pairs of draws, and the
    medians lie at least ``on_par`` of the better median apart (default: the baseline's own
    relative spread, ``draws.tolerance`` of the table's baseline runs). Their ``power`` is not
    computed here (nan): it depends on the runs that check them (``claims``). Each recorded run
    must be a draw of its own: a table with one seed twice in a point is refused (``draws.check``)."""
    draws.check(table, ["k", "method"], "the recorded sweep")
    if on_par is None:
        on_par = draws.tolerance(study.reference_runs(table))
    out = []
    for k in sorted(set(table["k"]) - {1} if ks is None else ks):
        runs = _runs_at(table, k)
        for i, a in enumerate(sweep.METHODS):
            for b in list(sweep.METHODS)[i + 1:]:
                if not runs[a] or not runs[b]:
                    continue
                p = superiority(runs[a], runs[b])
                better, worse, p = (a, b, p) if p >= 0.5 else (b, a, 1 - p)
                gap = _median(runs[worse]) - _median(runs[better])
                if p >= CLEAR and gap >= on_par * _median(runs[better]):
                    out.append(Claim(int(k), better, worse, round(p, 3), round(gap, 2), float("nan")))
    return out


def claims(table, ks=None, n: int | dict = 3, on_par: float | None = None) -> list[Claim]:
    """The firm orders (``orders``) that ``n`` new runs per method (a number, or one per method)
    can check: resampling the record's draws, the medians of that many runs keep the order at
    least ``CONFIDENCE`` of the time (so a machine that behaves like the recording fails a
    claim by chance less than once in fifty); ``power`` is that chance."""
    seeds = n if isinstance(n, dict) else {m: n for m in sweep.METHODS}
    out = []
    for claim in orders(table, ks, on_par):
        runs = _runs_at(table, claim.k)
        power = median_order_chance(runs[claim.better], runs[claim.worse], seeds[claim.better], seeds[claim.worse])
        if power >= CONFIDENCE:
            out.append(dataclasses.replace(claim, power=round(power, 3)))
    return out


def _runs_at(table, k: int) -> dict[str, list[float]]:
    at_k = table[table["k"] == k]
    return {m: at_k[at_k["method"] == m][METRIC].tolist() for m in sweep.METHODS}


def recorded_range(recorded) -> str:
    """A recorded point's draws in a few words: median, range and count."""
    recorded = sorted(recorded)
    return f"median {_median(recorded):.2f} %, {recorded[0]:.2f} to {recorded[-1]:.2f} %, {len(recorded)} seeds"


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
    """The points to train: ``--quick``'s (``QUICK_RUNS`` per method at ``QUICK_KS``) or every
    point of the sweep (``FULL_RUNS`` each), all with seeds the record does not hold."""
    fresh = draws.new_seeds(recorded["seed"], max(FULL_RUNS, *QUICK_RUNS.values()))
    if quick:
        return [sweep.Point(k, m, s) for k in QUICK_KS for m in sweep.METHODS for s in fresh[:QUICK_RUNS[m]]]
    return sweep.points(sweep.KS, fresh[:FULL_RUNS])


def report(mine, recorded) -> tuple[list[str], bool]:
    """The lines to print and whether every recorded claim holds here."""
    held = recorded.groupby(["k", "method"]).size()
    lines = ["Each new run of this machine among the recorded runs of its point (best top-1 validation",
             f"error; by chance alone, one more draw lands outside the range of {held.min()} recorded ones "
             f"{draws.outside_chance(int(held.min()))} of the time):"]
    for (k, method), runs in mine.sort_values(["k", "method", "seed"]).groupby(["k", "method"], sort=True):
        same = recorded[(recorded["k"] == k) & (recorded["method"] == method)][METRIC]
        lines.append(f"  k={k} {method} (recorded: {recorded_range(same)})")
        for row in runs.itertuples():
            value = getattr(row, METRIC)
            lines.append(f"    seed {row.seed}: {value:6.2f} %  {position(value, same)}")
    ks = sorted(set(mine["k"]) - {1})
    counts = mine[mine["k"] > 1].groupby(["k", "method"]).size().groupby("method").min()
    n = {m: int(counts.get(m, 0)) or 1 for m in sweep.METHODS}
    found, firm = claims(recorded, ks, n), orders(recorded, ks)
    lines.append(f"The guide's conclusions at k = {', '.join(map(str, ks))} that these runs can check "
                 "(orders the record shows firmly):")
    ok_all = True
    for claim in found:
        ok, line = check(claim, mine)
        ok_all &= ok
        lines.append("  " + line)
    more = [str(c) for c in firm if not any((c.k, c.better, c.worse) == (f.k, f.better, f.worse) for f in found)]
    if more:
        lines.append(f"  not checked, too few runs here for its margin (--full checks it):\n    {'; '.join(more)}")
    loose = [f"k={k} {a} / {b}" for k in ks for i, a in enumerate(sweep.METHODS) for b in list(sweep.METHODS)[i + 1:]
             if not any(c.k == k and {c.better, c.worse} == {a, b} for c in firm)]
    if loose:
        lines.append(f"  not checked, their recorded order not firm enough:\n    {'; '.join(loose)}")
    return lines, ok_all


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help=f"k = 32, every method, {min(QUICK_RUNS.values())} to {max(QUICK_RUNS.values())} new "
                      "seeds (default; minutes on 2 cores)")
    size.add_argument("--full", action="store_true", help=f"every point of the sweep, {FULL_RUNS} new seeds each")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per run (default: OMP_NUM_THREADS, else 1)")
    p.add_argument("--jobs", type=int, default=None, help="cores to keep busy (default: all of them)")
    p.add_argument("--results-dir", default=None,
                   help="where run records and verify.csv go (default: results/verify-DATE-TIME; must be new)")
    return p


def retrain(results: str | Path, *, full: bool = False, threads: int = 1, jobs: int = 1, progress: bool = True,
            command: str = f"{PROG} --quick"):
    """Train the sweep's points (``--quick``'s or, with ``full``, all) with seeds the record does
    not hold into ``results`` (which must be new or empty): the table of this machine's runs,
    also in ``verify.csv``."""
    results = Path(results)
    if results.exists() and any(results.iterdir()):
        raise GuideError(f"{results} already holds files; choose a new --results-dir (nothing is overwritten)")
    pts = plan(not full, sweep.recorded())
    return sweep.run(pts, results, results / "verify.csv", threads=[threads], jobs=jobs, command=command,
                     title="the guide's sweep points trained with new seeds", progress=progress)


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
    print("recorded: " + "\n  and: ".join(recorded.attrs["sources"]), flush=True)
    print(f"this machine: {hardware_label()}, {study_csv.cpu_isa()}, {threads} thread(s) per run, up to {jobs} "
          f"core(s); run records and verify.csv in {results}", flush=True)
    mine = retrain(results, full=args.full, threads=threads, jobs=jobs, command=" ".join([PROG, *argv]))
    lines, ok = report(mine, recorded)
    print("\n".join(lines))
    print(verdict(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
