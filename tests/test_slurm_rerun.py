"""tests/slurm_rerun.py: a test on the test Slurm runs once more only when a daemon of its
cluster died while it ran (or while its pre-submitted jobs did), and then says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

INNER = '''
import time

import pytest


class Cluster:
    def __init__(self):
        self.crashes = []

    def crashes_since(self, since):
        return [text for at, text in self.crashes if at >= since]


class Jobs:
    """A module's pre-submitted jobs, as tests/test_slurm_examples.py's Submission."""

    def __init__(self, cluster, attempt):
        self.cluster, self.attempt, self.submitted_at = cluster, attempt, time.monotonic()

    def again(self):
        return Jobs(self.cluster, self.attempt + 1)


CLUSTER = Cluster()
CLUSTER.crashes.append((time.monotonic(), "slurmd-guide-n1 died before any job was submitted"))


@pytest.fixture
def jobs():
    return Jobs(CLUSTER, 1)


def test_broken_by_a_crash(jobs):
    if jobs.attempt == 1:
        CLUSTER.crashes.append((time.monotonic(), "slurmd-guide-n2 died at 08:23:15"))
        pytest.fail("Task launch failed on node guide-n2")


def test_failing_on_its_own(jobs):
    assert jobs.attempt == 2, "a failure of the guide's own"


def test_failing_twice(jobs):
    CLUSTER.crashes.append((time.monotonic(), f"slurmd-guide-n2 died in attempt {jobs.attempt}"))
    assert False, f"attempt {jobs.attempt} failed"


def test_without_a_cluster():
    CLUSTER.crashes.append((time.monotonic(), "a crash of a cluster this test does not use"))
    assert False, "not rerun"
'''


def test_only_a_test_broken_by_a_daemons_crash_runs_again(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "slurm_rerun", "-p", "no:cacheprovider", "-rA",
                          "-q", "test_inner.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(Path(__file__).parent), "PATH": "/usr/bin:/bin"})
    text = out.stdout
    assert out.returncode == 1, text
    assert "PASSED test_inner.py::test_broken_by_a_crash" in text, text
    for failed in ("test_failing_on_its_own", "test_failing_twice", "test_without_a_cluster"):
        assert f"FAILED test_inner.py::{failed}" in text, text
    assert "attempt 2 failed" in text, text  # the second run's failure is the one reported
    assert text.count("run again: ") == 2, text  # the crash test and the twice-failing one, once each
    assert ("run again: slurmd-guide-n2 died at 08:23:15; the first run failed with Failed: Task launch failed "
            "on node guide-n2") in text, text
