"""The test Slurm's answer to a daemon that dies: tests/slurm_cluster.py restarts it (three
times at most), and tests/slurm_rerun.py runs a test once more only when a daemon of its
cluster died while it ran (or while its pre-submitted jobs did), when one of its jobs'
ranks died of a segmentation fault, or when the kernel killed a process for want of memory
meanwhile, and then says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import slurm_cluster

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


MPI = "[vm:32177] *** Process received signal ***\\n[vm:32177] Signal: Segmentation fault (11)\\n"
PYTHON = (MPI.replace("Signal: Segmentation fault (11)", "Fatal Python error: Segmentation fault\\n\\n"
          "Current thread 0x1 (most recent call first):\\n  File \\"/v/horovod/common/basics.py\\", line 122 in init\\n"
          "  File \\"/r/guide_utils/engine/distributed.py\\", line 197 in _horovod\\n\\n"
          "Thread 0x2 (most recent call first):\\n  File \\"/v/other.py\\", line 1 in elsewhere"))


class Logs(Jobs):
    def log(self):
        return PYTHON if self.attempt == 1 else ""

    def again(self):
        return Logs(self.cluster, self.attempt + 1)


def test_a_rank_segfaulted_under_open_mpi(jobs):
    if jobs.attempt == 1:
        pytest.fail(f"job 2501 FAILED 143:0\\n{MPI}srun: error: guide-n1: task 0: Segmentation fault")


@pytest.fixture
def logs():
    return Logs(CLUSTER, 1)


def test_a_rank_segfaulted_in_a_log(logs):
    assert logs.attempt == 2, "job 2502 FAILED"


def test_a_segfault_without_a_cluster():
    pytest.fail(MPI)
'''


def test_only_a_test_broken_by_a_daemons_crash_or_a_ranks_segfault_runs_again(tmp_path):
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
    assert "PASSED test_inner.py::test_a_rank_segfaulted_under_open_mpi" in text, text
    assert "PASSED test_inner.py::test_a_rank_segfaulted_in_a_log" in text, text
    assert "FAILED test_inner.py::test_a_segfault_without_a_cluster" in text, text
    assert text.count("run again: ") == 4, text  # two daemon crashes (one twice-failing), two segfaults
    assert "run again: a rank died of a segmentation fault (no Python stack printed); the first run" in text, text
    # the crashing thread's innermost frames, not the other thread's
    assert ("run again: a rank died of a segmentation fault in basics.py:122 init < distributed.py:197 _horovod; "
            "the first run failed with AssertionError: job 2502 FAILED") in text, text
    assert ("run again: slurmd-guide-n2 died at 08:23:15; the first run failed with Failed: Task launch failed "
            "on node guide-n2") in text, text


def test_a_daemon_that_keeps_dying_is_restarted_three_times_then_left_dead(tmp_path):
    """The watchdog's limit, on a stand-in daemon that exits at once (``false``): no Slurm."""
    cluster = slurm_cluster.SlurmCluster(tmp_path)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "slurmd-guide-n2.stdout").write_text("malloc(): unaligned tcache chunk detected\n")
    cluster.procs.append(("slurmd-guide-n2", subprocess.Popen(["false"])))
    for _ in range(6):
        for _, proc in cluster.procs:
            proc.wait(timeout=10)
        cluster._restart_dead()
    assert [c.restarted for c in cluster.crashes] == [True, True, True, False], cluster.crashes
    assert all(c.name == "slurmd-guide-n2" and c.status == 1 for c in cluster.crashes)
    assert "malloc(): unaligned tcache chunk detected" in cluster.crashes[0].tail
    assert str(cluster.crashes[-1]).endswith("left dead (it died four times)")


def test_the_kernels_oom_kills_while_the_cluster_runs_count_as_a_crash(tmp_path, monkeypatch):
    """A rise of /proc/vmstat's oom_kill while a test's jobs ran is noted with its time and
    listed by crashes_since, as a daemon's death is: the rerun plugin's condition (no Slurm)."""
    counts = iter([5, 5, 7, 7])
    monkeypatch.setattr(slurm_cluster, "_oom_kills", lambda: next(counts))
    cluster = slurm_cluster.SlurmCluster(tmp_path)  # reads 5
    before = slurm_cluster.time.monotonic()
    cluster._note_oom()  # 5: nothing
    assert cluster.crashes_since(0) == []
    cluster._note_oom()  # 7: two killed
    (kill,) = cluster.crashes_since(before)
    assert kill.count == 2 and "the kernel killed 2 process(es)" in str(kill)
    cluster._note_oom()  # 7 again: no new record
    assert cluster.crashes_since(kill.at + 1e-9) == [] and len(cluster.oom_kills) == 1
