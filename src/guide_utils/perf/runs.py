"""Throughput of one training setup, measured through the guide's own engine.

A :class:`Setup` is a worker count, a way of starting the workers and the engine flags that
differ from a base. :func:`throughput` runs it (one worker in a child process; several with
``horovodrun``, ``mpirun`` or ``torchrun``; or several *independent* workers started at
once, which train alone and so show what the machine can compute with no communication at
all) and returns the images per second of all workers together, from the run records.

The benchmarks ``benchmarks/two_worker_scaling.py`` and ``benchmarks/stepwise_tuning.py``
measure setups side by side with it, alternating, so that a change in the machine's load
hits every setup alike.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import GuideError

@dataclass(frozen=True)
class Setup:
    name: str
    workers: int = 1
    start: str = "alone"  # "alone" (one process), "independent", or a launcher: horovodrun, mpirun, torchrun
    flags: tuple[str, ...] = ()  # engine flags on top of the base
    env: tuple[tuple[str, str], ...] = ()  # environment for the workers (e.g. OpenMPI's MCA settings)
    note: str = ""

    def describe(self) -> str:
        how = {"alone": "1 process", "independent": f"{self.workers} independent processes"}.get(
            self.start, f"{self.workers} workers via {self.start}")
        extra = " ".join([*self.flags, *(f"{k}={v}" for k, v in self.env)])
        return f"{how}{' ' + extra if extra else ''}"


@dataclass
class Measured:
    setup: Setup
    rates: list[float] = field(default_factory=list)  # images/s of all workers together, per repetition

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def _records_rate(results: Path) -> float:
    total = 0.0
    for path in sorted(results.glob("*.jsonl")):
        rates = [json.loads(line).get("images_per_second") for line in path.read_text().splitlines()
                 if '"type": "epoch"' in line]
        if not rates or rates[-1] is None:
            raise GuideError(f"{path.name} has no throughput; run more steps than the meter's warm-up")
        total += rates[-1]
    if total == 0:
        raise GuideError(f"no run record in {results}")
    return total


def command(setup: Setup, base_flags: list[str], results: Path) -> list[list[str]]:
    """The command line(s) that start ``setup``: one per process for ``independent``."""
    from ..runtime import launch

    flags = [*base_flags, *setup.flags, "--results-dir", str(results), "--no-progress"]
    if setup.start == "alone":
        return [[sys.executable, "-m", "guide_utils.train", *flags]]
    if setup.start == "independent":
        return [[sys.executable, "-m", "guide_utils.train", *flags, "--run-name", f"independent-{i}"]
                for i in range(setup.workers)]
    if setup.start not in launch.LAUNCHERS:
        raise GuideError(f"setup {setup.name}: unknown start {setup.start!r}")
    from ..runtime import launchers

    dist = launchers.backend_of(setup.start)  # the launcher's usual backend: Horovod or DDP
    # the setup's variables reach every worker (mpirun passes only those it is told)
    return [launch.command(setup.start, setup.workers, "guide_utils.train", [*flags, "--dist", dist],
                           forward=[key for key, _ in setup.env])]


def throughput(setup: Setup, base_flags: list[str], *, timeout: float = 900) -> float:
    """Run ``setup`` once; images/s of all its workers together."""
    from ..runtime import local

    with tempfile.TemporaryDirectory(prefix="guide-setup-") as tmp:
        results = Path(tmp)
        argvs = command(setup, base_flags, results)
        try:  # a failed or stuck worker: every process is stopped, one line with the output's tail
            local.run(argvs if len(argvs) > 1 else argvs[0], env=dict(setup.env), timeout=timeout, show=False)
        except GuideError as exc:
            raise GuideError(f"setup {setup.name} failed: {exc}") from None
        return _records_rate(results)


def side_by_side(setups: list[Setup], base_flags: list[str], *, repeats: int = 3,
                 progress=None) -> dict[str, Measured]:
    """Every setup ``repeats`` times, in rounds (each round runs all setups, in an order that
    alternates between rounds), so slow drifts of the machine's load hit all of them alike."""
    out = {s.name: Measured(s) for s in setups}
    for r in range(repeats):
        order = setups if r % 2 == 0 else list(reversed(setups))
        for s in order:
            rate = throughput(s, base_flags)
            out[s.name].rates.append(rate)
            if progress:
                progress(f"round {r + 1}/{repeats}: {s.name:<28} {rate:8.1f} img/s (load {os.getloadavg()[0]:.1f})")
    return out


def summary(measured: dict[str, Measured], reference: str) -> list[dict[str, Any]]:
    """One row per setup: its median images/s and its ratio to ``reference``, both as the ratio
    of medians and as the median of the per-round ratios (robust to drift between rounds)."""
    ref = measured[reference]
    rows = []
    for name, m in measured.items():
        paired = [a / b for a, b in zip(m.rates, ref.rates)]
        rows.append({"setup": name, "how": m.setup.describe(), "images_per_second": m.median,
                     "runs": [round(r, 1) for r in m.rates], "ratio": statistics.median(paired),
                     "note": m.setup.note})
    return rows
