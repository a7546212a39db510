"""Training from a notebook on ipyparallel engines (guide_utils.cluster.interactive).

* Interactive = batch: two MPI engines end with the weights digest of the same run under
  ``mpirun -np 2`` (and DDP on the same engines with that digest too).
* Slurm-launched engines on the real two-node test Slurm (tests/slurm_cluster.py): after a
  normal stop, an exception and a SIGKILL of the kernel, ``squeue`` is empty and no process
  of the cluster remains.
* Each bad input is one line: ipyparallel missing, more engines than the allocation, a
  partition or account the site profile lacks, engines not up within the timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slurm_cluster

from guide_utils.cluster import interactive, sites, watchdog
from guide_utils.core.config import make_config
from guide_utils.core.errors import GuideError
from guide_utils.runtime.ports import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# A killed kernel: the reaper notices within a second, scancel, then Slurm's KillWait (10 s here).
GONE_WITHIN = 60

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
slurm = pytest.mark.slurm
mpi = pytest.mark.skipif(shutil.which("mpiexec") is None,
                         reason="mpiexec not found: sudo apt-get install -y openmpi-bin libopenmpi-dev")


@pytest.fixture(autouse=True)
def _yielding_mpi(monkeypatch):
    """Two MPI ranks (each with Horovod's background thread) on two shared cores: OpenMPI's
    busy polling starves the other rank, and a 2-engine run took twice as long. Yielding
    while idle changes no number; engines, mpirun and Slurm jobs all inherit it."""
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "1")


def _smoke(tmp_path: Path, dist: str, **kw):
    return make_config("smoke", dist=dist, epochs=1, results_dir=str(tmp_path / "results" / dist), **kw)


def _nothing_left(cluster_id: str, jobs: list[str], within: float = GONE_WITHIN) -> float:
    """Seconds until no process carries the cluster id and the jobs left squeue; fails past ``within``."""
    start = time.monotonic()
    while True:
        procs = watchdog.processes_of(cluster_id)
        queued = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout.strip() \
            if jobs else ""
        if not procs and not queued:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            pytest.fail(f"after {within} s: processes {[p.cmdline()[:4] for p in procs]}, squeue {queued!r}")
        time.sleep(0.5)


# -- bad input, no cluster needed -------------------------------------------------------------

def test_missing_ipyparallel_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipyparallel", None)
    with pytest.raises(GuideError, match=r"^ipyparallel is not installed in this kernel's environment .*"
                                         r"pip install -r requirements.txt") as exc:
        interactive.EngineCluster(n=2).start()
    assert "\n" not in str(exc.value)


def test_more_mpi_engines_than_the_allocation_is_one_line(monkeypatch):
    for name, value in {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(GuideError) as exc:
        interactive.EngineCluster(n=4).start()
    assert str(exc.value) == ("4 engines asked for, but this Slurm job (77) has 2 task(s); ask for at most 2, "
                              "or start the session with more tasks")


def test_a_site_profile_without_an_account_is_refused_like_the_examples_do(tmp_path):
    broken = tmp_path / "noaccount.sh"
    broken.write_text("".join(line for line in (REPO / "slurm_examples/sites/ci.sh").read_text().splitlines(True)
                              if not line.startswith("GUIDE_ACCOUNT=")))
    with pytest.raises(GuideError) as exc:
        interactive.EngineCluster(n=2, engines="slurm", site=str(broken)).start()
    assert str(exc.value) == (f"site profile {broken} does not set GUIDE_ACCOUNT; add it "
                              "(see slurm_examples/sites/TEMPLATE.sh)")


def test_the_engines_batch_script_comes_from_the_site_profile(tmp_path):
    """thesis-taito: account, partition, GPUs in its --gres syntax, 4 engines per node; the
    software set-up and the controller watch of lib/guide.sh; shellcheck-clean."""
    site = sites.read_site("thesis-taito")
    script = sites.engines_batch_script(site, 8, walltime="00:30:00", log="/logs/ipengine-%j.out",
                                        controller=("login1", 40123))
    text = script.format(cluster_id="c1", program_and_args="python -m ipyparallel.engine --mpi")
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks=8", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --account=project_0000000", "#SBATCH --partition=gpu", "#SBATCH --gres=gpu:p100:4",
                 "#SBATCH --time=00:30:00", "guide_load_site", "guide_software",
                 '"${GUIDE_EXEC[@]}" python -m guide_utils.cluster.watchdog controller login1 40123 5 3 &']:
        assert line in text.splitlines(), f"{line!r} not in\n{text}"
    assert "GUIDE_DIST=horovod GUIDE_LAUNCH=tasks" in text.splitlines()
    assert text.splitlines()[-1] == 'srun "${GUIDE_SRUN_TASKS[@]}" python -m ipyparallel.engine --mpi'
    # ... which are the training's srun options: the site's MPI plugin, its srun options, the
    # software prefix (lib/guide.sh's guide_task_options, run here outside a job).
    probe = ('source slurm_examples/lib/guide.sh; guide_load_site; GUIDE_EXEC=(); GUIDE_DIST=horovod '
             'GUIDE_LAUNCH=tasks; guide_task_options; printf "%s\\n" "${GUIDE_SRUN_TASKS[@]}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=REPO,
                         env={**env, "GUIDE_ROOT": str(REPO), "GUIDE_SITE": "thesis-taito"})
    assert out.stdout.split() == ["--kill-on-bad-exit=1", f"--mpi={site.srun_mpi}"], out.stderr
    (tmp_path / "engines.sbatch").write_text(text)
    out = subprocess.run(["shellcheck", str(tmp_path / "engines.sbatch")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_controller_watch_cancels_its_job_when_the_controller_is_gone(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'cancelled'}\n")
    (fake / "scancel").chmod(0o755)
    port = free_port()  # nothing listens there
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "guide_utils.cluster.watchdog", "controller", "127.0.0.1", str(port),
                          "0.2", "3"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cancelled").read_text().split() == ["4242"]
    assert time.monotonic() - start < 20  # 3 misses 0.2 s apart, plus Python's start
    assert "controller at 127.0.0.1" in out.stdout


# -- MPI engines on this node -------------------------------------------------------------

@mpi
def test_interactive_digest_equals_the_batch_digest(tmp_path):
    """The same seed and flags: 2 MPI engines (Horovod, then DDP on the same engines) end
    with the weights of `mpirun -np 2 python -m guide_utils.train` (Horovod)."""
    from guide_utils.runtime import launch

    with interactive.EngineCluster(n=2) as cluster:
        cluster_id = cluster.cluster_id
        hvd = cluster.train(_smoke(tmp_path, "horovod"), live=False)
        ddp = cluster.train(_smoke(tmp_path, "ddp"), live=False)
        assert len(watchdog.processes_of(cluster_id)) >= 3  # controller, mpiexec, 2 engines
    _nothing_left(cluster_id, [])
    batch_dir = tmp_path / "results" / "batch"
    launch.run("mpirun", 2, "guide_utils.train", ["--profile", "smoke", "--dist", "horovod", "--epochs", "1",
                                                 "--no-progress", "--results-dir", str(batch_dir)], echo=None)
    (record,) = batch_dir.glob("*.jsonl")
    batch = [json.loads(line) for line in record.read_text().splitlines()][-1]["weights_digests"]
    assert hvd.digests == batch and len(set(batch)) == 1, (hvd.digests, batch)
    assert ddp.digests == batch
    assert hvd.run.summary["ranks_agree"] and hvd.run.config["workers"] == 2
    assert hvd.run.epochs["epoch"].tolist() == [1]


# -- engines as a job of the real test Slurm -------------------------------------------------

test_slurm = pytest.fixture(scope="module", name="test_slurm")(slurm_cluster.module_cluster)


@pytest.fixture
def on_slurm(test_slurm, tmp_path, monkeypatch):
    """This test's environment: the test Slurm, the CI site profile, logs in tmp_path."""
    for name, value in {"SLURM_CONF": test_slurm.env["SLURM_CONF"], "GUIDE_SITE": "ci",
                        "GUIDE_LOG_DIR": str(tmp_path / "logs")}.items():
        monkeypatch.setenv(name, value)
    return tmp_path


@slurm
def test_slurm_engines_train_one_epoch_and_leave_nothing(on_slurm):
    with interactive.EngineCluster(n=2, engines="slurm", site="ci") as cluster:
        job, cluster_id = cluster.job_id, cluster.cluster_id
        assert interactive.job_state(job) == "RUNNING"
        result = cluster.train(_smoke(on_slurm, "horovod", max_steps_per_epoch=10), live=False)
    assert result.run.summary["ranks_agree"] and result.workers == 2
    assert result.run.environment["slurm"]["job_id"] == int(job)  # trained inside the engines' job
    assert "== ipyparallel engines: job" in cluster.log_path.read_text()
    assert cluster.log_path.with_name(f"ipengine-{cluster_id}.sbatch").is_file()  # what was submitted, beside it
    _nothing_left(cluster_id, [job])


@slurm
def test_slurm_engines_are_gone_after_an_exception(on_slurm):
    with pytest.raises(ZeroDivisionError):
        with interactive.EngineCluster(n=2, engines="slurm", site="ci") as cluster:
            job, cluster_id = cluster.job_id, cluster.cluster_id
            raise ZeroDivisionError("a cell failed")
    _nothing_left(cluster_id, [job])


@slurm
def test_the_job_cancels_itself_when_its_controller_dies(on_slurm):
    """The last line of defence (the notebook's whole node gone, reaper included): the watch
    in the engines' batch script cancels the job once the controller stops answering."""
    import psutil

    cluster = interactive.EngineCluster(n=2, engines="slurm", site="ci", watch=(2.0, 3)).start()
    try:
        job, res = cluster.job_id, cluster._res
        res.reaper.kill()  # the notebook's node is gone: its reaper with it,
        controller = psutil.Process(res.cluster.controller.process.pid)
        for proc in [controller, *controller.children(recursive=True)]:  # and the controller's processes
            proc.kill()
        start = time.monotonic()
        while interactive.job_state(job) and time.monotonic() - start < GONE_WITHIN:
            time.sleep(0.5)
        assert interactive.job_state(job) is None, f"job {job} still {interactive.job_state(job)}"
        assert "is gone: cancelling job" in cluster.log_path.read_text()
    finally:
        cluster.stop()
    _nothing_left(cluster.cluster_id, [job])


@slurm
def test_engines_not_up_in_time_name_the_job_and_show_its_log(on_slurm, capsys):
    cluster = interactive.EngineCluster(n=2, engines="slurm", site="ci", timeout=1)
    with pytest.raises(GuideError) as exc:
        cluster.start()
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"0 of the 2 engines of Slurm job {cluster.job_id} (")
    assert f"did not all register within 1 s; see its log {cluster.log_path} (above)" in message
    assert "--- the last lines of its log" in capsys.readouterr().out
    _nothing_left(cluster.cluster_id, [cluster.job_id])


@slurm
@pytest.mark.parametrize("change, message", [
    ("GUIDE_PARTITION=nosuch", "partition 'nosuch' of site profile {file} is not a partition of this cluster (ci); "
                               "fix GUIDE_PARTITION"),
    ("GUIDE_TASKS_PER_NODE=1", "3 engines at 1 per node (GUIDE_TASKS_PER_NODE) need 3 nodes, but partition 'ci' "
                               "has 2; ask for at most 2 engines"),
])
def test_what_the_cluster_cannot_give_is_one_line(on_slurm, change, message):
    name = change.split("=")[0]
    profile = on_slurm / "site.sh"
    profile.write_text("".join(line if not line.startswith(name + "=") else change + "\n"
                               for line in (REPO / "slurm_examples/sites/ci.sh").read_text().splitlines(True)))
    with pytest.raises(GuideError) as exc:
        interactive.EngineCluster(n=3, engines="slurm", site=str(profile)).start()
    assert str(exc.value) == message.format(file=profile)
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout == ""  # nothing submitted


class _Kernel:
    """A Jupyter kernel (jupyter_client) that runs cells and returns (stdout, stderr, error)."""

    def __init__(self, cwd: Path):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 300) -> tuple[str, str, dict | None]:
        msg_id = self.kc.execute(code)
        out, err, error = [], [], None
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                (out if content["name"] == "stdout" else err).append(content["text"])
            elif kind == "error":
                error = content
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out), "".join(err), error

    def reply(self, msg_id: str, timeout: float = 120) -> dict:
        """The shell channel's reply to ``msg_id`` (earlier replies, e.g. kernel_info's, are skipped)."""
        while True:
            msg = self.kc.get_shell_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@slurm
def test_a_killed_kernel_leaves_no_job_and_no_engine(on_slurm):
    """SIGKILL runs no Python in the kernel: the reaper (outside it) cancels the engines' job
    and ends the controller. Before that, a bad input shows as one line, no traceback."""
    kernel = _Kernel(on_slurm)
    try:
        out, err, error = kernel.run("from guide_utils.cluster import interactive\n"
                                     "interactive.one_line_errors()\n"
                                     "interactive.EngineCluster(n=5, engines='slurm', site='ci').start()")
        assert err == ("error: 5 engines at 2 per node (GUIDE_TASKS_PER_NODE) need 3 nodes, but partition 'ci' "
                       "has 2; ask for at most 4 engines\n") and "Traceback" not in out + err
        out, err, error = kernel.run("cluster = interactive.EngineCluster(n=2, engines='slurm', site='ci').start()\n"
                                     "print(cluster.job_id, cluster.cluster_id)")
        assert error is None, error
        job, cluster_id = out.split()
        assert interactive.job_state(job) == "RUNNING" and watchdog.processes_of(cluster_id)
        os.kill(kernel.pid, signal.SIGKILL)
        took = _nothing_left(cluster_id, [job])
        print(f"job {job} and every process of {cluster_id} gone {took:.1f} s after the kernel was killed")
    finally:
        kernel.close()


@mpi
def test_an_interrupted_cell_and_a_restarted_kernel_leave_no_engine(tmp_path):
    """Stopping a training cell (KeyboardInterrupt in the kernel) stops the cluster; so does a
    kernel restart (the finalizer runs as the kernel exits; the reaper if it is killed first)."""
    kernel = _Kernel(tmp_path)
    try:
        cell = ("from guide_utils.cluster import interactive\nfrom guide_utils.core.config import make_config\n"
                "with interactive.EngineCluster(n=2) as cluster:\n"
                "    print('cluster', cluster.cluster_id, flush=True)\n"
                f"    cluster.train(make_config('smoke', dist='ddp', epochs=100, results_dir={str(tmp_path)!r}))")
        msg_id = kernel.kc.execute(cell)
        text, cluster_id = "", None
        while "[train] epoch 1/" not in text:  # interrupt once it is training
            msg = kernel.kc.get_iopub_msg(timeout=300)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                text += msg["content"]["text"]
        cluster_id = text.split("cluster ", 1)[1].split()[0]
        kernel.km.interrupt_kernel()
        reply = kernel.reply(msg_id)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        _nothing_left(cluster_id, [])

        out, err, error = kernel.run("cluster = interactive.EngineCluster(n=2).start()\nprint(cluster.cluster_id)")
        assert error is None, error
        cluster_id = out.strip()
        assert watchdog.processes_of(cluster_id)
        kernel.km.restart_kernel(now=False)
        took = _nothing_left(cluster_id, [])
        print(f"every process of {cluster_id} gone {took:.1f} s after the restart")
    finally:
        kernel.close()
