"""Measurements stated as they were measured: the median and the range of their rounds,
paired where the rounds alternated, and a target called met only when the whole range
clears it.

A benchmark that alternates two loops (``benchmarks/throughput.py``,
``benchmarks/step_overhead.py``, ``benchmarks/monitor_overhead.py``) measures them in
pairs, so the drift of a shared machine hits both members of a pair alike: their ratio or
difference is taken round by round (:func:`paired`), and the rounds' range is what the
record can say. With two rounds the range is just the two values; it is still the honest
statement, and a median alone is not.

>>> s = rounds([3348.07, 3588.28])
>>> f"{s:.0f}", s.brief(".0f")
('3468 (3348 to 3588, 2 rounds)', '3468 [3348, 3588]')
>>> d = paired([847.8, 753.8, 750.0, 674.8, 723.5], [689.8, 760.1, 508.7, 708.5, 718.1], "difference")
>>> f"{d:.0f}"
'5 (-34 to 241, 5 rounds)'
>>> verdict(d, 150, at_most=True), d.count_beyond(150)
('undecided', 2)
>>> verdict(paired([3657.8, 3649.4], [3632.3, 3625.2]), 0.97)
'met'
>>> verdict(paired([3348.1, 3588.3], [3545.6, 3585.7]), 0.97)
'undecided'
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Spread:
    """The median, lowest and highest of ``n`` rounds (``values``, as measured)."""

    median: float
    low: float
    high: float
    n: int
    values: tuple[float, ...] = ()

    @property
    def relative_range(self) -> float:
        """The range as a share of the median: (high - low) / |median|."""
        return (self.high - self.low) / abs(self.median)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def count_beyond(self, limit: float, above: bool = True) -> int:
        """How many rounds lie beyond ``limit``: above it, or below it with ``above=False``."""
        return sum(v > limit if above else v < limit for v in self.values)

    def brief(self, spec: str = "") -> str:
        """``median [low, high]``, for a table's cell."""
        return f"{self.median:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"

    def __format__(self, spec: str) -> str:
        def f(x: float) -> str:
            return format(x, spec)

        if self.n == 1:
            return f"{f(self.median)} (one round)"
        return f"{f(self.median)} ({f(self.low)} to {f(self.high)}, {self.n} rounds)"


def rounds(values: Iterable[float]) -> Spread:
    """The spread of one quantity's rounds."""
    values = tuple(float(v) for v in values)
    if not values:
        raise ValueError("no rounds to summarise")
    return Spread(statistics.median(values), min(values), max(values), len(values), values)


def paired(a: Sequence[float], b: Sequence[float], how: str = "ratio") -> Spread:
    """Round by round ``a[i] / b[i]`` (``how="ratio"``) or ``a[i] - b[i]`` (``"difference"``):
    for two loops measured alternately, one pair per round."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired rounds need as many of each, got {len(a)} and {len(b)}")
    if how == "ratio":
        return rounds(x / y for x, y in zip(a, b))
    if how == "difference":
        return rounds(x - y for x, y in zip(a, b))
    raise ValueError(f"how must be 'ratio' or 'difference', got {how!r}")


def verdict(s: Spread, target: float, at_most: bool = False) -> str:
    """``"met"`` when every round clears ``target`` (at least it, or at most it with
    ``at_most``), ``"missed"`` when none does, ``"undecided"`` when the range straddles it."""
    every, some = (s.high <= target, s.low <= target) if at_most else (s.low >= target, s.high >= target)
    return "met" if every else "undecided" if some else "missed"
