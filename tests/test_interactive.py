"""Training from a notebook on ipyparallel engines (guide_utils.cluster.interactive).

* Interactive = batch: two MPI engines end with the weights digest of the same run under
  ``mpirun -np 2`` (and DDP on the same engines with that digest too).
* Slurm-launched engines on the real two-node test Slurm (tests/slurm_cluster.py): after a
  normal stop, an exception and a SIGKILL of the kernel, ``squeue`` is empty and no process
  of the cluster remains.
* No silent hang: an engine killed (SIGKILL; Slurm engines), and one frozen (SIGSTOP; MPI
  engines), in the middle of a run end the training in one line naming the engine, within
  the epoch's deadline; the jobs of the test Slurm have a /dev/shm of their own; the watch's
  other cases (an engine the controller dropped, one that never started, an exception on
  one rank, the engines' job ended, an epoch past its deadline) with stand-ins.
  benchmarks/interactive_stress.py runs this file round after round in one process.
* Each bad input is one line: ipyparallel missing, more engines than the allocation, a
  partition or account the site profile lacks, engines not up within the timeout.
* Submitting from inside a job (a notebook kernel that runs as a job, salloc): the outer
  job's SLURM_* variables do not reach the engines' job, nor a job submit.sh submits.
* A queued engines' job is waited for (its state and reason shown) as long as the user's
  queue_timeout says; the controller's engine ports come from a given range; MPI engines on
  several nodes talk over the nodes' interface, on one host over loopback.
"""

from __future__ import annotations

import contextlib
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
from guide_utils.runtime.ports import free_port, free_ports

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


def test_the_connection_file_is_read_once_it_is_whole(tmp_path):
    """The controller writes its connection file in place: seen empty in CI, where reading
    it then crashed the cluster's start. It is read once it parses, else one line."""
    import threading

    from guide_utils.cluster.interactive.launch import connection_info, controller_endpoint

    path = tmp_path / "security" / "ipcontroller-c1-engine.json"
    path.parent.mkdir()
    path.write_text("")
    info = {"interface": "tcp://0.0.0.0", "location": "node7", "registration": 50001}
    timer = threading.Timer(0.5, lambda: path.write_text(json.dumps(info)))
    timer.start()
    try:
        assert controller_endpoint(connection_info(str(tmp_path), "c1", timeout=20)) == ("node7", 50001)
    finally:
        timer.cancel()
    path.write_text('{"interface": "tcp://')
    with pytest.raises(GuideError, match=r"wrote no complete connection file .* in 0 s"):
        connection_info(str(tmp_path), "c1", timeout=0.3)


class _Unanswered:
    """Stand-in client: engines 0 and 1 registered; the first ``silent`` requests are never
    answered (what CI saw once: a request sent as the engines registered), later ones are."""

    def __init__(self, silent: int):
        self.ids, self.silent, self.asked = [0, 1], silent, 0

    def __getitem__(self, ids):
        return self

    def apply_async(self, f):
        from ipyparallel.error import TimeoutError as NoAnswer

        self.asked += 1
        answered = self.asked > self.silent

        class Result:
            def get(self, timeout):
                if not answered:
                    time.sleep(timeout)
                    raise NoAnswer("no answer")
                return [(1, 2, "node2", 12), (0, 2, "node1", 11)]

        return Result()


@pytest.mark.parametrize("silent", [1, 2])
def test_engines_that_do_not_answer_are_asked_again_then_named_in_one_line(monkeypatch, capsys, silent):
    from types import SimpleNamespace

    from guide_utils.cluster.interactive import engines

    monkeypatch.setattr(engines, "IDENTIFY_WAIT", 0.05)
    cluster = interactive.EngineCluster(n=2, engines="mpi")
    res = SimpleNamespace(client=_Unanswered(silent), cluster=SimpleNamespace(engine_set=None))
    if silent == 1:
        cluster._identify(res)
        assert cluster._ranks == [1, 0] and cluster._hosts == ["node1", "node2"] and res.client.asked == 2
    else:
        with pytest.raises(GuideError, match=r"^2 of the 2 MPI engines \(mpiexec\) registered but did not answer "
                                             r"within 0 s; see their output"):
            cluster._identify(res)
        assert res.client.asked == 2


def test_the_last_epochs_line_is_waited_for_when_the_result_comes_first(capsys):
    """ipyparallel sends an engine's result and its printed lines on different channels: the
    result can be in while the last epoch's line is not (ci37: Horovod's epoch line was
    missing from chapter 9's cell). A stand-in result in that state: the line is shown."""
    from guide_utils.cluster.interactive import follow
    from guide_utils.cluster.interactive.follow import Follower

    class ResultFirst:  # the state ipyparallel's AsyncResult.wait_for_output documents
        stdout = ["[train] mnist1d: 3200 train / 800 val samples\n"]
        waited = None

        def ready(self):
            return True

        def wait_for_output(self, timeout):
            self.waited = timeout
            self.stdout = [self.stdout[0] + "[train] epoch 1/1  lr 0.025  loss 1.5892\n"]
            return True

    class AllWell:  # a watch that sees nothing wrong
        def epoch(self, done, began, seconds):
            pass

        def check(self, client, ar, total):
            return None

        def dead(self, ar):
            return None

    ar = ResultFirst()
    follower = Follower(make_config("smoke", dist="horovod", epochs=1), 2, live=False, progress=False)
    follow.follow(ar, follower, AllWell(), client=None, stop=None)
    follower.close()
    assert ar.waited == follow.OUTPUT_WAIT
    assert "[train] epoch 1/1" in capsys.readouterr().out


# -- no silent hang: what the watch of a training sees (stand-ins), then real engines ---------

class _Run:
    """Stand-in AsyncResult of a run on two engines: what each printed, and each engine's
    part (its own future, as ``AsyncResult.split`` gives them: None while it runs)."""

    def __init__(self, stdout: list[str], done: bool = False, parts: list | None = None):
        self.msg_ids, self.stdout, self.stderr, self.done = ["m0", "m1"], stdout, ["", ""], done
        self.parts = parts or [None, None]
        self.metadata = [{"completed": None}, {"completed": None}]

    def ready(self):
        return self.done

    def get(self, return_exceptions=False):
        return self.parts

    def split(self):
        from concurrent.futures import Future

        futures = []
        for part in self.parts:
            futures.append(Future())
            if isinstance(part, Exception):
                futures[-1].set_exception(part)
        return futures


def _watch(monkeypatch, ended=None, **deadlines):
    from types import SimpleNamespace

    from guide_utils.cluster.interactive import watch

    engines = [watch.Engine(3, 0, "nodeA", 11), watch.Engine(4, 1, "nodeB", 22)]  # not this host's processes
    started = [watch.STARTED.format(rank=e.rank, size=2, host=e.host, pid=e.pid) + "\n" for e in engines]
    client = SimpleNamespace(ids=[3, 4])
    w = watch.Watch(engines, interactive.Deadlines(**deadlines), lambda: ended, "the engines' log x.out")
    return w, client, started


TAIL = ("; the cluster was stopped (engines inside a collective cannot be reused): start a new EngineCluster and run "
        "again, and see the engines' log x.out")


def test_an_engine_that_died_or_froze_is_named_in_one_line_with_its_last_output(monkeypatch):
    """The controller dropped engine 4 (its heartbeats stopped) while its peer waits for it in a
    collective, where the run would wait forever: the watch names it at once; so too an
    engine whose part failed as dead (EngineError), during the run and once it has ended, and
    an exception on one rank while the other waits."""
    from ipyparallel.error import RemoteError

    from guide_utils.cluster.interactive import watch

    w, client, started = _watch(monkeypatch)
    ar = _Run([started[0] + "[train] epoch 2/5  lr 0.025  loss 0.80\n", started[1]])
    assert w.check(client, ar, 5) is None
    client.ids = [3]
    assert w.check(client, ar, 5) == (
        "engine 4 (rank 1 on nodeB, pid 22) died or stopped answering the controller's heartbeats (killed, frozen, "
        "out of memory, or its node is gone); its last output: '[engine] rank 1 of 2 on nodeB (pid 22): started'"
        + TAIL)

    w, client, started = _watch(monkeypatch)
    dead = RemoteError("EngineError", "Engine 3 died while running task 'm0'", None)
    assert w.check(client, _Run(started, parts=[dead, None]), 5).startswith(  # its nanny's word: at once
        "engine 3 (rank 0 on nodeA, pid 11) died or stopped answering the controller's heartbeats")
    ended = _Run([started[0] + "[train] epoch 2/5\n", started[1]], done=True, parts=[dead, dead])
    ended.metadata = [{"completed": "2026-12-06 10:00:01"}, {"completed": "2026-12-06 10:00:00"}]
    assert w.dead(ended).startswith("engine 4 (rank 1 on nodeB, pid 22) died")  # the first to go

    w, client, started = _watch(monkeypatch)
    ar = _Run(started, parts=[None, RemoteError("ValueError", "shard 7 is empty", None)])
    assert w.check(client, ar, 5) is None  # raised on every rank alike it would be the run's result
    monkeypatch.setattr(watch, "FAILED_ALONE", 0.0)
    line = w.check(client, ar, 5)
    assert line.startswith("engine 4 (rank 1 on nodeB, pid 22) failed alone: ValueError: shard 7 is empty; its "
                           "last output: '[engine] rank 1 of 2 on nodeB (pid 22): started'") and "\n" not in line


def test_an_engine_that_never_started_and_a_launcher_that_ended_are_named(monkeypatch):
    w, client, started = _watch(monkeypatch, join=0)
    line = w.check(client, _Run([started[0] + "[train] mnist1d: 3200 train\n", ""]), 5)
    assert line == ("engine 4 (rank 1 on nodeB, pid 22) did not start the run within 0 s of the request (it never "
                    "reached it, or the engine is stuck); rank 0's last output: '[train] mnist1d: 3200 train'" + TAIL)
    w, client, started = _watch(monkeypatch, check=0, ended="ended: Slurm job 42 is SUSPENDED")
    assert w.check(client, _Run(started), 5) == "the engines' launcher ended: Slurm job 42 is SUSPENDED" + TAIL


def test_the_engines_job_is_ended_unless_it_runs(monkeypatch, tmp_path):
    """What the watch asks of Slurm engines: their job's state (a stand-in squeue says it)."""
    from types import SimpleNamespace

    (tmp_path / "squeue").write_text('#!/bin/sh\ncat "$(dirname "$0")/state"\n')
    (tmp_path / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cluster = interactive.EngineCluster(n=2, engines="slurm")
    cluster.job_id, res = "42", SimpleNamespace(cluster=object())
    for state, ended in (("RUNNING", None), ("SUSPENDED", "ended: Slurm job 42 is SUSPENDED"),
                         ("", "ended: the job left the queue"), ("CANCELLED", "ended: the job left the queue")):
        (tmp_path / "state").write_text(state + "\n")
        assert cluster._engines_ended(res) == ended, state
    assert cluster._engines_ended(None) == "the cluster was stopped"


def test_epoch_deadlines_come_from_the_first_epoch(monkeypatch):
    """The first epoch: deadlines.first_epoch from the request; each later one factor x the
    first (timed from rank 0's first line), at least floor; a frozen engine of this host is
    named by its process state (a stopped `sleep` stands in for it)."""
    from guide_utils.cluster.interactive import watch

    assert interactive.Deadlines(factor=3, floor=60).epoch_limit(None) == 3600
    assert [interactive.Deadlines(factor=3, floor=60).epoch_limit(s) for s in (5, 50)] == [60, 150]
    w, client, started = _watch(monkeypatch, first_epoch=100, factor=3, floor=10)
    ar = _Run([started[0] + "[train] epoch 1/5\n", started[1]])
    w.start -= 99
    assert w.check(client, ar, 5) is None
    w.epoch(1, began=time.monotonic() - 6)  # epoch 1 took 6 s once rank 0 was set up
    assert w.first == pytest.approx(6, abs=1) and w.check(client, ar, 5) is None
    w.first, w.epochs = None, 0
    w.epoch(1, began=time.monotonic(), seconds=6.0)  # its lines came together: rank 0's own timing
    assert w.first == 6.0
    from guide_utils.cluster.interactive.follow import Follower  # which reads it from rank 0's epoch line

    follower = Follower(make_config("smoke", dist="horovod", epochs=5), 2, live=False, progress=False)
    follower.feed("[train] epoch 1/5  lr 0.025  loss 1.5892  train top-1 err 60.03%  val top-1 err 40.38% top-5 "
                  "1.75%  3083 img/s  6.0 s\n")
    assert (follower.done, follower.first_seconds) == (1, 6.0)
    w.last_epoch_at -= 19  # epoch 2 has run 19 s of its 18
    assert w.check(client, ar, 5) == (
        "epoch 2 of 5 did not end within 18 s (3 x the first epoch's 6.0 s, at least 10 s) though every engine answers "
        "the controller's heartbeats: a rank waits in a collective another never entered, or an epoch of this run "
        "is slower (then raise deadlines=Deadlines(...)); rank 0's last output: '[train] epoch 1/5'" + TAIL)
    frozen = subprocess.Popen(["sleep", "60"])
    try:
        frozen.send_signal(signal.SIGSTOP)
        while watch.stopped_here(watch.Engine(4, 1, watch.socket.gethostname(), frozen.pid)) is None:
            time.sleep(0.05)
        w.engines[1] = watch.Engine(4, 1, watch.socket.gethostname(), frozen.pid)
        w.on_hang = lambda: "their output above, with every engine's stacks"  # what EngineCluster shows
        line = w.check(client, ar, 5)
        assert f"18 s (3 x the first epoch's 6.0 s, at least 10 s): engine 4 (rank 1 on {w.engines[1].host}, pid " \
               f"{frozen.pid}) is stopped (SIGSTOP or a debugger); its last output: '[engine] rank 1 of 2 on " \
               f"nodeB (pid 22): started'" in line
        assert line.endswith("see their output above, with every engine's stacks")
    finally:
        frozen.kill()
        frozen.wait()


def test_mpi_engines_yield_their_core_only_when_they_have_none_to_spare(monkeypatch):
    """As many MPI engines as cores (the kernel and the controller share them): OpenMPI yields
    while an engine waits. With cores to spare it keeps its default; a notebook's own setting
    is never overridden. Counted for a 2-core and a 64-core node, not this machine's."""
    from guide_utils.cluster.interactive.launch import engine_environment

    yield_var = "OMPI_MCA_mpi_yield_when_idle"
    monkeypatch.delenv(yield_var, raising=False)
    for name in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(name)  # engines on this host
    for cores, engines, expected in ((2, 2, "1"), (2, 4, "1"), (64, 4, None), (64, 64, "1")):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert engine_environment("mpi", engines).get(yield_var) == expected, (cores, engines)
    assert yield_var not in engine_environment("slurm", 2)  # a Slurm job's engines: the job's settings
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setenv(yield_var, "0")
    assert yield_var not in engine_environment("mpi", 2)  # the notebook's "0" reaches them as it is


def test_mpi_engines_use_loopback_on_one_host_and_the_nodes_interface_on_several(monkeypatch):
    """Inside a one-node allocation (or none) the transports stay on loopback; across an
    allocation's nodes they use the site's interface, else the one this host routes to the
    other nodes by (here a node name that resolves to loopback: lo; a name that resolves to
    this machine's own network address: that interface), never loopback by default."""
    import socket

    import psutil

    from guide_utils.cluster.interactive.launch import engine_environment
    from guide_utils.runtime import launch

    lo = launch.loopback_interface()
    for name in ("MASTER_ADDR", launch.IFACE_SITE_VAR, *launch.IFACE_VARS):
        monkeypatch.delenv(name, raising=False)
    for name in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    env = engine_environment("mpi", 2)
    assert {env[v] for v in launch.IFACE_VARS} == {lo} and env["MASTER_ADDR"] == "127.0.0.1"

    for name, value in {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "8"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(launch.IFACE_SITE_VAR, "ib0")  # the site's choice
    env = engine_environment("mpi", 8)
    assert {env[v] for v in launch.IFACE_VARS} == {"ib0"} and "MASTER_ADDR" not in env
    monkeypatch.delenv(launch.IFACE_SITE_VAR)
    # gpu01 and gpu02 do not resolve here: no interface can be told, so none is forced
    assert not set(launch.IFACE_VARS) & set(engine_environment("mpi", 8))

    monkeypatch.setattr(socket, "gethostbyname", lambda host: "127.0.0.1" if host == "guide-a" else host)
    assert launch.network_interface(["guide-a", "localhost"], {}) == lo  # the route to loopback
    own = [(name, a.address) for name, addrs in psutil.net_if_addrs().items() for a in addrs
           if a.family == socket.AF_INET and not a.address.startswith("127.")]
    if own:  # a name resolving to this machine's own address: the interface that holds it
        name, address = own[0]
        assert launch.network_interface([address], {}) == name
    assert launch.network_interface(["guide-a"], {}) == lo


def test_controller_ports_are_a_checked_range():
    cluster = interactive.EngineCluster(n=2, ports="50000-50019")
    assert cluster.ports == "50000-50019"
    with pytest.raises(GuideError) as exc:
        interactive.EngineCluster(n=2, ports="50000-50003")
    assert str(exc.value) == ("controller ports '50000-50003': the engines connect to 9 ports of the controller; "
                              "give at least 9 distinct ports between 1 and 65535, e.g. 50000-50008")
    with pytest.raises(GuideError, match="give a range such as 50000-50019"):
        interactive.EngineCluster(n=2, ports="fifty")


# -- MPI engines on this node -------------------------------------------------------------

def _signal_after_epoch(results: Path, epoch: int, pid: int, signum: int, sent: list[float]) -> None:
    """In a thread: ``signum`` to ``pid`` once rank 0's record in ``results`` has ``epoch``
    epochs (the next one under way); the time it was sent into ``sent``."""
    import threading

    def send():
        end = time.monotonic() + 300
        while not any(f'"epoch": {epoch},' in p.read_text() for p in results.glob("*.jsonl")):
            if time.monotonic() > end:
                return
            time.sleep(0.05)
        os.kill(pid, signum)
        sent.append(time.monotonic())

    threading.Thread(target=send, daemon=True).start()


@mpi
def test_interactive_digest_equals_the_batch_digest(tmp_path):
    """The same seed and flags: 2 MPI engines (Horovod, then DDP on the same engines) end
    with the weights of `mpirun -np 2 python -m guide_utils.train` (Horovod). Then, on the
    same engines, one frozen (SIGSTOP) in the middle of an epoch ends the run in one line
    that names it, within the epoch's deadline (3 x the first epoch, at least 8 s)."""
    import re

    from guide_utils.runtime import launch

    with interactive.EngineCluster(n=2) as cluster:
        cluster_id = cluster.cluster_id
        hvd = cluster.train(_smoke(tmp_path, "horovod"), live=False)
        ddp = cluster.train(_smoke(tmp_path, "ddp"), live=False)
        assert len(watchdog.processes_of(cluster_id)) >= 3  # controller, mpiexec, 2 engines
        frozen, sent = cluster._engines[1], []
        _signal_after_epoch(tmp_path / "frozen", 2, frozen.pid, signal.SIGSTOP, sent)
        with pytest.raises(GuideError) as exc:
            cluster.train(make_config("smoke", dist="horovod", epochs=100, results_dir=str(tmp_path / "frozen")),
                          live=False, deadlines=interactive.Deadlines(factor=3, floor=8))
        took, found, message = time.monotonic() - sent[0], cluster.last_watch.found_at - sent[0], str(exc.value)
        print(f"a frozen engine: named {found:.1f} s after the SIGSTOP, the run ended {took:.1f} s after: {message}")
        assert "\n" not in message
        assert f"engine {frozen.eid} (rank 1 on {frozen.host}, pid {frozen.pid}) is stopped (SIGSTOP or a " \
               "debugger); its last output: '[engine] rank 1 of 2" in message
        limit = re.search(r"^epoch \d+ of 100 did not end within (\d+) s", message)  # else its heartbeats (35 s)
        assert found < (int(limit.group(1)) if limit else 35) + 3, message  # a look every half second
        assert not cluster.running
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
def test_slurm_engines_train_one_epoch_and_leave_nothing(on_slurm, test_slurm):
    """... with the controller's engine-facing sockets on the ports given (a firewall's range).
    Then, on the same engines, one killed (SIGKILL) in the middle of a run ends it in one line
    that names it, well within the epoch's deadline (at least 8 s), and the block ends by that
    exception (a failed cell): nothing is left. (A block left normally:
    test_engines_submitted_from_inside_a_job_get_none_of_its_variables.)"""
    import psutil

    ports = free_ports(interactive.ENGINE_PORTS_NEEDED)
    with pytest.raises(GuideError) as exc:
        with interactive.EngineCluster(n=2, engines="slurm", site="ci", ports=ports) as cluster:
            job, cluster_id = cluster.job_id, cluster.cluster_id
            assert interactive.job_state(job) == "RUNNING"
            used = [p for v in cluster.engine_ports.values() for p in (v if isinstance(v, list) else [v])]
            assert sorted(used) == sorted(ports), cluster.engine_ports
            controller = cluster._res.cluster.controller.process.pid
            pids = [controller, *(c.pid for c in psutil.Process(controller).children(recursive=True))]
            listening = {port for _, _, _, port in test_slurm.listening_sockets(pids)}
            assert set(ports) <= listening, (ports, listening)
            # the jobs' /dev/shm is their test Slurm's own: another one's MPI step of the same job id
            # shared memory with the engines and Horovod waited forever (issue 56; slurm_cluster._namespace)
            shm = test_slurm.in_namespace("stat", "-c", "%d", "/dev/shm").stdout.strip()
            assert shm != str(os.stat("/dev/shm").st_dev)
            # a hang fails in one line naming the engine and its output, long before pytest's timeout
            result = cluster.train(_smoke(on_slurm, "horovod", max_steps_per_epoch=10), live=False,
                                   deadlines=interactive.Deadlines(first_epoch=300))
            killed, sent = cluster._engines[1], []
            _signal_after_epoch(on_slurm / "killed", 1, killed.pid, signal.SIGKILL, sent)
            cluster.train(make_config("smoke", dist="horovod", epochs=100, max_steps_per_epoch=10,
                                      results_dir=str(on_slurm / "killed")),
                          live=False, deadlines=interactive.Deadlines(floor=8))
    found, message = cluster.last_watch.found_at - sent[0], str(exc.value)
    print(f"a killed engine: named {found:.1f} s after the SIGKILL: {message}")
    assert "\n" not in message and message.startswith(
        f"engine {killed.eid} (rank 1 on {killed.host}, pid {killed.pid}) is gone (its process ended); its last "
        "output: '[engine] rank 1 of 2"), message
    assert found < 8 and not cluster.running
    assert result.run.summary["ranks_agree"] and result.workers == 2
    assert result.run.environment["slurm"]["job_id"] == int(job)  # trained inside the engines' job
    assert "== ipyparallel engines: job" in cluster.log_path.read_text()
    assert cluster.log_path.with_name(f"ipengine-{cluster_id}.sbatch").is_file()  # what was submitted, beside it
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
    assert f"did not all register within 1 s of their start; see its log {cluster.log_path} (above)" in message
    assert "--- the last lines of its log" in capsys.readouterr().out
    _nothing_left(cluster.cluster_id, [cluster.job_id])


def _profile(folder: Path, **values: str) -> Path:
    """The CI site profile with some values changed, as a file in ``folder``."""
    lines = (REPO / "slurm_examples/sites/ci.sh").read_text().splitlines(True)
    text = "".join(line if line.split("=")[0] not in values else f"{line.split('=')[0]}={values[line.split('=')[0]]}\n"
                   for line in lines)
    path = folder / "site.sh"
    path.write_text(text)
    return path


@slurm
def test_a_queued_engines_job_is_waited_for_with_its_state_shown(on_slurm, capsys):
    """A held job (as if the queue were full) stays queued longer than the engines' start-up
    timeout: the cluster waits, showing Slurm's state and reason, and comes up once the job
    runs; the old timeout (counted from submission) tore it down while it was pending."""
    import threading

    site = _profile(on_slurm, GUIDE_SBATCH_EXTRA="(--hold)")
    cluster = interactive.EngineCluster(n=2, engines="slurm", site=str(site), timeout=60, live=False)
    started: list = []
    thread = threading.Thread(target=lambda: started.append(cluster.start()), daemon=True)
    t0 = time.monotonic()
    thread.start()
    try:
        while cluster.job_id is None or interactive.job_state(cluster.job_id) != "PENDING":
            assert time.monotonic() - t0 < 60 and thread.is_alive(), "the engines' job was not submitted"
            time.sleep(0.2)
        cluster.timeout = 3  # shorter than the wait in the queue below: it must not count there
        time.sleep(6)
        assert thread.is_alive() and interactive.job_state(cluster.job_id) == "PENDING"
        subprocess.run(["scontrol", "release", cluster.job_id], check=True)
        cluster.timeout = 60
        thread.join(120)
        assert started and cluster.running and len(cluster.client.ids) == 2
    finally:
        cluster.stop()
    out = capsys.readouterr().out
    assert f"engines: Slurm job {cluster.job_id} PENDING (JobHeldUser); waited 0:00, no limit (queue_timeout=None): " \
           "interrupt to cancel the job" in out, out
    assert f"engines: Slurm job {cluster.job_id} RUNNING" in out
    _nothing_left(cluster.cluster_id, [cluster.job_id])


@slurm
def test_a_queue_timeout_cancels_the_pending_job_in_one_line(on_slurm):
    site = _profile(on_slurm, GUIDE_SBATCH_EXTRA="(--hold)")
    cluster = interactive.EngineCluster(n=2, engines="slurm", site=str(site), queue_timeout=2, live=False)
    with pytest.raises(GuideError) as exc:
        cluster.start()
    assert str(exc.value).startswith(f"the engines' Slurm job {cluster.job_id} is still PENDING (JobHeldUser) after "
                                     "2 s in the queue (queue_timeout=2); it was cancelled.")
    _nothing_left(cluster.cluster_id, [cluster.job_id])


# An outer job like a notebook's kernel started by a hub or salloc: its memory request is
# per CPU, the new job's per node. Leaked into the new job, the outer job's
# SLURM_MEM_PER_CPU makes srun refuse the step ("mutually exclusive").
OUTER = "#!/bin/bash\n#SBATCH --mem-per-cpu=100\n#SBATCH --output={log}\nset -e\ncd {repo}\n{body}\n"


def _outer_job(test_slurm, folder: Path, body: str) -> str:
    """Run ``body`` as a batch job of the test Slurm; its log."""
    log = folder / "outer.out"
    script = folder / "outer.sbatch"
    script.write_text(OUTER.format(log=log, repo=REPO, body=body))
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    records = test_slurm.wait(job.stdout.strip().split(";")[0], timeout=240)
    text = log.read_text()
    assert records[0]["JobState"] == "COMPLETED", text
    return text


@slurm
def test_engines_submitted_from_inside_a_job_get_none_of_its_variables(on_slurm, test_slurm):
    site = _profile(on_slurm, GUIDE_SBATCH_EXTRA="(--mem=200)")
    code = ("from guide_utils.cluster import interactive\n"
            f"with interactive.EngineCluster(n=2, engines='slurm', site={str(site)!r}, live=False) as c:\n"
            "    print('engines up:', len(c.client.ids), 'job', c.job_id, 'cluster', c.cluster_id, flush=True)\n")
    (on_slurm / "engines.py").write_text(code)
    text = _outer_job(test_slurm, on_slurm, f"{BIN / 'python'} {on_slurm / 'engines.py'}")
    assert "engines up: 2" in text, text
    job, cluster_id = text.split("engines up: 2 job ")[1].split()[0], text.split(" cluster ")[-1].split()[0]
    _nothing_left(cluster_id, [job])


@slurm
def test_submit_sh_from_inside_a_job_passes_none_of_its_variables(on_slurm, test_slurm):
    inner = on_slurm / "inner.sbatch"
    inner.write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=1\nset -e\nenv | grep '^SLURM_MEM' || true\n"
                     "srun --ntasks=1 true\necho inner step ran\n")
    body = (f"GUIDE_SITE=ci slurm_examples/submit.sh {inner} --mem=200 --parsable > {on_slurm / 'inner.id'}")
    _outer_job(test_slurm, on_slurm, body)
    job = (on_slurm / "inner.id").read_text().strip().split(";")[0]
    test_slurm.wait(job, timeout=120)
    log = next((on_slurm / "logs").glob(f"*-{job}.out")).read_text()
    assert "inner step ran" in log and "mutually exclusive" not in log, log
    assert "SLURM_MEM_PER_CPU" not in log and "SLURM_MEM_PER_NODE=200" in log, log


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
        """Run a cell. A cell sent right after one that failed can find the kernel still
        aborting what was queued behind the failure (ipykernel's stop_on_error): it is then
        not run at all (its reply says "aborted"; seen under load), and is sent again."""
        while True:
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
                    break
            if self.reply(msg_id, timeout)["content"]["status"] != "aborted":
                return "".join(out), "".join(err), error

    def value(self, expression: str, timeout: float = 120):
        """``expression`` evaluated in the kernel, from the shell channel's reply (not from
        printed output, which a loaded machine has delivered after the cell's end)."""
        import ast

        while True:
            msg_id = self.kc.execute("", silent=True, user_expressions={"v": expression})
            reply = self.reply(msg_id, timeout)["content"]
            if reply["status"] != "aborted":  # see run()
                break
        found = reply["user_expressions"]["v"]
        assert found["status"] == "ok", found
        return ast.literal_eval(found["data"]["text/plain"])

    def reply(self, msg_id: str, timeout: float = 120) -> dict:
        """The shell channel's reply to ``msg_id`` (earlier replies, e.g. kernel_info's, are skipped)."""
        while True:
            msg = self.kc.get_shell_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def reply_or_fail(self, msg_id: str, cluster_id: str, timeout: float) -> dict:
        """The reply to ``msg_id`` within ``timeout`` s, or a failure that says what the kernel
        printed meanwhile and which of the cluster's processes are left. A bound for a hang,
        not for speed: stopping a cluster takes seconds alone and minutes on a machine whose
        other worker runs a test Slurm's tens of trainings (120 s was once not enough)."""
        import queue

        end, printed = time.monotonic() + timeout, []
        while time.monotonic() < end:
            with contextlib.suppress(queue.Empty):
                msg = self.kc.get_shell_msg(timeout=1)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return msg
            with contextlib.suppress(queue.Empty):
                while True:
                    msg = self.kc.get_iopub_msg(timeout=0)
                    if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] in ("stream", "error"):
                        printed.append(msg["content"].get("text") or msg["content"].get("ename", ""))
        left = [" ".join(p.cmdline()[:3]) for p in watchdog.processes_of(cluster_id)]
        pytest.fail(f"no reply {timeout:g} s after the interrupt; the kernel printed since: "
                    f"{''.join(printed)[-1500:]!r}; the cluster's processes left: {left}")

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
        out, err, error = kernel.run("cluster = interactive.EngineCluster(n=2, engines='slurm', site='ci').start()")
        assert error is None, error
        job, cluster_id = kernel.value("(cluster.job_id, cluster.cluster_id)")
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
        reply = kernel.reply_or_fail(msg_id, cluster_id, timeout=300)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        _nothing_left(cluster_id, [])

        out, err, error = kernel.run("cluster = interactive.EngineCluster(n=2).start()")
        assert error is None, error
        cluster_id = kernel.value("cluster.cluster_id")
        assert watchdog.processes_of(cluster_id)
        kernel.km.restart_kernel(now=False)
        took = _nothing_left(cluster_id, [])
        print(f"every process of {cluster_id} gone {took:.1f} s after the restart")
    finally:
        kernel.close()
