"""The check at the end of every test session (tests/leftovers.py): a process the run started
that outlives it is found by its run id, with its descendants, killed, and fails the run;
another run's processes are left alone."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import leftovers
import slurm_cluster

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def _start(run_ids: str, argv=SLEEP, **kw) -> subprocess.Popen:
    env = {**os.environ, leftovers.VAR: run_ids}
    return subprocess.Popen(argv, env=env, start_new_session=True, **kw)


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _untagged_children(pid: int) -> list[int]:
    """The children of ``pid`` whose environment lacks the run id."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid \
                    and leftovers.VAR.encode() not in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            pass
    return found


def test_a_process_of_the_run_and_its_untagged_child_are_found_and_killed_another_runs_is_not():
    run = "test-run-1"
    # a process of an enclosing run's run inside it; its child has no id at all
    parent = _start(f"outer-run,{run}", ["sh", "-c", f"env -u {leftovers.VAR} {shlex.join(SLEEP)} & wait"])
    other = _start("another-run")
    try:
        deadline = time.monotonic() + 30
        while not _untagged_children(parent.pid) and time.monotonic() < deadline:  # env has run the child
            time.sleep(0.1)
        (child,) = _untagged_children(parent.pid)
        found = leftovers.alive(run)
        assert set(found) == {parent.pid, child}, found
        assert other.pid not in found and os.getpid() not in found

        left = leftovers.check(run, grace_s=0.5)
        assert left == found  # what each was, for the run's summary
        assert parent.wait(timeout=10) == -signal.SIGKILL and _gone(child)
        assert other.poll() is None, "another run's process must be left alone"
        assert leftovers.check(run, grace_s=0.5) == {}
    finally:
        for p in (parent, other):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_a_process_holding_a_file_in_a_folder_of_the_run_is_found_without_the_id(tmp_path, monkeypatch):
    """As slurmstepd: its environment overwritten, its parent not the run's, its log open in
    the test Slurm's folder (named with ``own``)."""
    monkeypatch.setenv(leftovers.VAR, "test-run-3")
    folder = tmp_path / "cluster"
    folder.mkdir()
    leftovers.own(folder)
    try:
        assert leftovers.folders("test-run-3") == [str(folder.resolve())]
        env = {k: v for k, v in os.environ.items() if k != leftovers.VAR}
        with open(folder / "node.log", "w") as log:
            holder = subprocess.Popen(SLEEP, env=env, stdout=log, cwd="/", start_new_session=True)
        beside = subprocess.Popen(SLEEP, env=env, cwd=tmp_path, start_new_session=True)  # not inside it
        try:
            found = leftovers.alive("test-run-3", inside=leftovers.folders("test-run-3"))
            assert holder.pid in found and beside.pid not in found, found
        finally:
            for p in (holder, beside):
                p.kill()
                p.wait()
    finally:
        leftovers._registry("test-run-3").unlink(missing_ok=True)


def test_a_process_that_ends_within_the_grace_is_not_a_leftover():
    proc = _start("test-run-2", [sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        assert leftovers.check("test-run-2", grace_s=30) == {}
    finally:
        proc.wait()


def test_a_run_inside_a_test_gets_its_own_id_after_the_enclosing_runs(monkeypatch):
    monkeypatch.setenv(leftovers.VAR, "outer-run")
    inner = leftovers.tag()
    assert os.environ[leftovers.VAR] == f"outer-run,{inner}" and inner != "outer-run"


def test_a_run_that_leaves_a_process_running_fails_and_names_it(tmp_path):
    """A whole pytest run, with the check as a plugin: its one test passes but leaves a
    process running in a session of its own; the run fails, names it, and it is gone."""
    marker = "a-process-left-by-the-inner-test"
    (tmp_path / "test_inner.py").write_text(
        "import subprocess, sys\n\n"
        "def test_leaves_one():\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(900)', {marker!r}],\n"
        "                     start_new_session=True)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), leftovers.GRACE_VAR: "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "leftovers", "-p", "no:cacheprovider", "-q",
                          "test_inner.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)  # a pytest starting on a loaded machine (both cores busy beside it) is slow
    assert out.returncode == 1 and "1 passed" in out.stdout, out.stdout + out.stderr
    assert "processes this run started that outlived it (killed now)" in out.stdout, out.stdout
    (line,) = [ln for ln in out.stdout.splitlines() if marker in ln]
    assert _gone(int(line.split()[1].rstrip(":"))), line


@pytest.mark.slurm
@pytest.mark.slow
def test_a_stopped_test_slurm_leaves_no_step_of_a_running_job(tmp_path, tmp_path_factory):
    """A job still running when the test Slurm stops: its slurmstepd would outlive slurmd
    (by design), so stop() cancels the jobs and ends whatever is left in the namespace."""
    root = tmp_path_factory.mktemp("slurm")  # short: slurmstepd's socket path must fit 108 bytes
    cluster = slurm_cluster.start_or_skip(slurm_cluster.SlurmCluster(root))
    ours = [root, tmp_path]
    try:
        out = subprocess.run(["sbatch", "--parsable", "-N", "2", "--wrap", "srun sleep 300"], cwd=tmp_path,
                             env=cluster.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not [p for p in leftovers.alive("none", inside=ours).values()
                                                   if p.endswith("sleep 300")]:
            time.sleep(0.5)
        running = leftovers.alive("none", inside=ours)
        queue = subprocess.run(["squeue", "-h", "-o", "%i %T %R"], env=cluster.env, capture_output=True, text=True)
        # the batch step and step 0
        assert sum("slurmstepd" in p for p in running.values()) >= 2, (queue.stdout, running)
    finally:
        cluster.stop()
    assert leftovers.alive("none", inside=ours) == {}
