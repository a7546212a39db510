"""What a recorded study's runs can say by chance: each run of a point is one draw only when
its seed is its own.

A run is a draw from the distribution of a point's outcomes when it differs from the point's
other runs in its seed. The same seed trained again at another thread count is not another
draw (the first recorded sweep's runs of one seed at one and at two threads correlate at 0.66
to 0.9998, point by point), so a study counts seeds, never thread counts (``check``), and a
check that trains a point again takes seeds its record does not hold (``new_seeds``). Given n
draws of a point, exchangeable and without ties:

* one more draw lands outside their range with chance 2 / (n + 1) (``outside_chance``), above
  their largest with chance 1 / (n + 1) (``above_chance``);
* the baseline's own spread gives the tolerance the chapters judge a run by (``tolerance``):
  near the baseline is at most its worst recorded run, the widest limit that accepts no run
  worse than every baseline run, and the narrowest that calls none of the baseline's own runs
  far from it.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Sequence

from ..core.errors import GuideError


def repeated(table, by: Sequence[str], seed: str = "seed") -> list[tuple]:
    """The (group of ``by``..., seed) that occur more than once in ``table``: one seed counted
    twice in a group, e.g. at two thread counts. Empty when every run of a group is its own draw
    (or the table has no ``seed`` column)."""
    if seed not in table.columns or table.empty:
        return []
    counts = table.groupby([*by, seed], sort=True).size()
    return [key if isinstance(key, tuple) else (key,) for key in counts[counts > 1].index]


def check(table, by: Sequence[str], what: str = "the table") -> None:
    """Refuse statistics over ``table`` grouped by ``by`` where one group holds a seed twice."""
    twice = repeated(table, by)
    if twice:
        first = ", ".join(f"{c}={v}" for c, v in zip([*by, "seed"], twice[0]))
        raise GuideError(f"{what} holds {len(twice)} seed(s) more than once in one point (first: {first}); "
                         "the same seed at another thread count is not another draw: group by threads too, "
                         "or keep one run per seed")


def new_seeds(held: Iterable[int], n: int) -> list[int]:
    """The ``n`` smallest seeds (from 0) that are not in ``held``: fresh draws for a check."""
    held, out, seed = {int(s) for s in held}, [], 0
    while len(out) < n:
        if seed not in held:
            out.append(seed)
        seed += 1
    return out


def outside_chance(n: int) -> Fraction:
    """The chance that one more draw lands outside the range of ``n`` exchangeable draws: 2 / (n + 1)."""
    if n < 2:
        raise GuideError(f"a range needs at least 2 draws, got {n}")
    return Fraction(2, n + 1)


def above_chance(n: int) -> Fraction:
    """The chance that one more draw lands above the largest of ``n`` exchangeable draws: 1 / (n + 1)."""
    if n < 1:
        raise GuideError(f"a largest draw needs at least 1 draw, got {n}")
    return Fraction(1, n + 1)


def tolerance(baseline: Iterable[float]) -> float:
    """The relative tolerance the baseline's own draws give: worst / median - 1, so that a run is
    near the baseline when its error is at most (1 + tolerance) x the baseline's median, its
    worst draw. One more draw of the baseline itself lands past it ``above_chance(n)`` of the time."""
    import statistics

    values = [float(v) for v in baseline]
    if not values:
        raise GuideError("a tolerance needs the baseline's runs; the table has none")
    return max(values) / statistics.median(values) - 1
