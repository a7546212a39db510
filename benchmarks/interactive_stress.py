#!/usr/bin/env python
"""Do the interactive tests hang when they run again and again in one process? Runs
``tests/test_interactive.py`` (or the tests ``-k`` picks) ``--rounds`` times in this one
pytest process, round after round (the module's test Slurm started once), each test with a
``--timeout`` far below CI's 1200 s, and reports every failure and every hang (a test
pytest-timeout stopped, its stacks in the log) with the round it happened in.

    sudo .venv/bin/python benchmarks/interactive_stress.py                  # 10 rounds, about 30 min on 2 cores
    .venv/bin/python benchmarks/interactive_stress.py --rounds 20 -k "digest or slurm_engines_train"

Chapter 9's Slurm training once sat at 0 % for 20 minutes in CI beside the other interactive
tests while it passed alone (issue 56): this is the repetition that looks for that. (Its cause
was outside this process: another test Slurm's MPI step of the same job id, running at the
same time, shared /dev/shm and so OpenMPI's shared-memory segments with the engines; every
test Slurm now gives its jobs a /dev/shm of their own, tests/slurm_cluster.py.) Exit
status 1 if any test failed or hung. Not a timed test: the seconds it prints are this
machine's, beside whatever else runs on it. The Slurm tests need root (the test Slurm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROUND = "stress_round"


class Rounds:
    """A pytest plugin: every collected test once per round, the rounds one after the other;
    each test's outcome, duration and whether pytest-timeout stopped it."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.reports: list[dict] = []
        self.leaks: list[tuple[int, str, list[str]]] = []

    @pytest.fixture
    def stress_round(self, request):
        return request.param

    def pytest_generate_tests(self, metafunc):
        metafunc.fixturenames.append(ROUND)
        metafunc.parametrize(ROUND, range(1, self.rounds + 1), indirect=True, ids=lambda r: f"round{r}")

    @pytest.hookimpl(trylast=True)  # after conftest's order, which stays within a round
    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: item.callspec.params.get(ROUND, 0) if hasattr(item, "callspec") else 0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        """What a test left changed in this process's environment (sbatch passes it all on to
        the engines' job, so one test's leftover reaches the next one's engines)."""
        before = dict(os.environ)
        yield
        after = dict(os.environ)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if changed:
            self.leaks.append((_round_of(item.nodeid), item.name.split("[")[0], changed))

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            text = str(report.longrepr or "")
            self.reports.append({"test": report.nodeid.split("::", 1)[1].split("[")[0], "nodeid": report.nodeid,
                                 "when": report.when, "outcome": report.outcome,
                                 "seconds": round(report.duration, 2),
                                 "hang": "from pytest-timeout" in text or "Timeout >" in text,
                                 "round": _round_of(report.nodeid)})


def _round_of(nodeid: str) -> int:
    tail = nodeid.rsplit("round", 1)
    return int(tail[1].split("]")[0].split("-")[0]) if len(tail) == 2 and tail[1][:1].isdigit() else 0


def summary(reports: list[dict], rounds: int) -> dict:
    """Failures and hangs by round, the rounds passed in a row from the first, and each test's
    seconds (median and slowest over the rounds)."""
    bad = [r for r in reports if r["outcome"] == "failed"]
    failed_rounds = sorted({r["round"] for r in bad})
    in_a_row = next((i - 1 for i in range(1, rounds + 1) if i in failed_rounds), rounds)
    seconds = defaultdict(list)
    for r in reports:
        if r["when"] == "call":
            seconds[r["test"]].append(r["seconds"])
    return {"rounds": rounds, "passed_in_a_row": in_a_row, "failures": sum(not r["hang"] for r in bad),
            "hangs": sum(r["hang"] for r in bad), "failed": [(r["round"], r["test"], r["when"]) for r in bad],
            "tests": len(seconds), "seconds": {t: (round(statistics.median(s), 1), max(s))
                                               for t, s in sorted(seconds.items())}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/interactive_stress.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("-k", dest="select", help="pytest's -k: the tests to repeat (default: all of the file)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per test before it counts as a hang")
    p.add_argument("--tests", default=str(REPO / "tests" / "test_interactive.py"))
    args = p.parse_args(argv)
    plugin = Rounds(args.rounds)
    pytest_args = [args.tests, "-q", "-p", "no:cacheprovider", f"--timeout={args.timeout:g}",
                   "-o", "timeout_func_only=false", "--durations=0"] + (["-k", args.select] if args.select else [])
    start, load = time.monotonic(), os.getloadavg()[0]
    code = pytest.main(pytest_args, plugins=[plugin])
    result = summary(plugin.reports, args.rounds)
    wall = time.monotonic() - start
    print(f"\n{args.rounds} rounds of {result['tests']} tests in one process: {wall:.0f} s; "
          f"{result['passed_in_a_row']} round(s) in a row passed, {result['failures']} failure(s), "
          f"{result['hangs']} hang(s) (over {args.timeout:g} s); load {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    for rnd, test, when in result["failed"]:
        print(f"  round {rnd}: {test} ({when})")
    for rnd, test, names in plugin.leaks:
        print(f"  round {rnd}: {test} left the environment changed: {', '.join(names)}")
    for test, (median, slowest) in result["seconds"].items():
        print(f"  {median:7.1f} s median, {slowest:7.1f} s slowest  {test}")
    print(json.dumps({"benchmark": "interactive_stress", "wall_s": round(wall, 1), **result,
                      "environment_leaks": len(plugin.leaks)}))
    return 1 if code != 0 or result["failures"] or result["hangs"] else 0


if __name__ == "__main__":
    sys.exit(main())
