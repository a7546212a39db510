"""One more run for a test that a crash of the test Slurm broke, not the guide's code.

Debian's Slurm 22.05 slurmd has aborted in the tests (glibc "malloc(): unaligned tcache chunk
detected", while launching a step of a job that had just requeued itself). tests/slurm_cluster.py
restarts a daemon that dies, as a site's service manager would, and records it; the jobs in
flight then may fail for that reason alone. This plugin (imported by conftest.py) runs such a
test once more, with its pre-submitted jobs submitted again, and says so in a warning.
"""

from __future__ import annotations

import time

import pytest


def _slurm_clusters(item) -> list:
    """The test Slurm clusters a test uses: fixtures that are one (``crashes_since``) or hold one."""
    found = []
    for value in item.funcargs.values():
        for candidate in (value, getattr(value, "cluster", None)):
            if hasattr(candidate, "crashes_since") and candidate not in found:
                found.append(candidate)
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test on the test Slurm that failed while one of its daemons died (and was restarted:
    tests/slurm_cluster.py) runs once more, its pre-submitted jobs submitted again, with a
    warning naming the crash. Only such a test: any other failure stands, and so does a
    second failure. What it tests is the guide's scripts, not Slurm 22.05's heap."""
    clusters = _slurm_clusters(item)
    since = min([time.monotonic(), *(getattr(v, "submitted_at", float("inf")) for v in item.funcargs.values())])
    try:
        return (yield)
    except (Exception, pytest.fail.Exception) as exc:
        crashes = [c for cluster in clusters for c in cluster.crashes_since(since)]
        if not crashes:
            raise
        first = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    for name, value in list(item.funcargs.items()):
        if callable(getattr(value, "again", None)):
            item.funcargs[name] = value.again()
    item.warn(pytest.PytestWarning(f"run again: {'; '.join(map(str, crashes))}; the first run failed with {first}"))
    return item.runtest()
