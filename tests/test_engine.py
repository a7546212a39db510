"""The training engine end to end on CPU: records, resume, distributed agreement, failure."""

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

from conftest import BIN, MPI_AS_ROOT, child_env

PY = sys.executable
TRAIN = [PY, "-m", "guide_utils.train", "--profile", "smoke", "--no-progress"]
TIMEOUT = 240


def _records(results: Path) -> list[dict]:
    files = sorted(results.glob("*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def _summary(results: Path) -> dict:
    return [r for r in _records(results) if r["type"] == "summary"][-1]


@pytest.mark.slow
def test_smoke_run_writes_a_record(tmp_path):
    from guide_utils.core.config import make_config
    from guide_utils.engine import train

    cfg = make_config("smoke", epochs=3, results_dir=str(tmp_path), progress=False)
    result = train(cfg)
    assert result.completed_epochs == 3 and not result.preempted
    rows = [r for r in _records(tmp_path) if r["type"] == "epoch"]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert 0 <= row["val_top1_err"] <= 100 and row["val_top5_err"] <= row["val_top1_err"]
        assert row["images_per_second"] > 0 and row["seconds"] > 0
    # smoke profile: 1 worker x 32 with base 0.1 @ 256 -> 0.0125, x0.1 from epoch index 2 (the 3rd)
    config = _records(tmp_path)[0]["config"]
    assert config["peak_lr"] == pytest.approx(0.0125) and config["global_batch"] == 32
    assert [r["lr"] for r in rows] == pytest.approx([0.0125, 0.0125, 0.00125])
    # it learned something: MNIST-1D has 10 classes, chance is 90% error
    assert rows[-1]["val_top1_err"] < 80


def test_the_optimizer_flag_chooses_the_class():
    import torch
    from timm.optim import Lamb, Lars

    from guide_utils.core.config import make_config
    from guide_utils.engine.state import make_optimizer

    params = [torch.nn.Parameter(torch.ones(3))]
    for name, cls in (("sgd", torch.optim.SGD), ("lars", Lars), ("lamb", Lamb)):
        opt = make_optimizer(make_config("smoke", optimizer=name), params, lr=0.4)
        assert type(opt) is cls and opt.param_groups[0]["lr"] == 0.4
        assert opt.param_groups[0]["weight_decay"] == 1e-4


@pytest.mark.slow
def test_a_monitored_run_records_utilisation_over_time(tmp_path):
    from guide_utils.core.config import make_config
    from guide_utils.engine import train
    from guide_utils.core.records import read_run

    # A sample every 0.05 s: on a fast, idle machine the run takes well under a second (a
    # clean-clone CI run saw 0.4 s and only 2 samples at 0.2 s).
    result = train(make_config("smoke", epochs=2, results_dir=str(tmp_path), progress=False, monitor=0.05))
    samples = read_run(result.record_path).samples
    seconds = sum(e["seconds"] for e in result.epochs)
    assert len(samples) >= min(3, int(seconds / 0.05)), f"a sample every 0.05 s of a {seconds:.2f} s run"
    assert samples["t"].is_monotonic_increasing and (samples["process_cpu_percent"] > 0).any()
    assert {"cpu_percent", "memory_used_gib", "process_rss_gib"} <= set(samples.columns)
    import threading

    assert not [t for t in threading.enumerate() if t.name == "guide-monitor"], "the sampler must stop with the run"
@pytest.mark.slow
def test_a_quiet_run_prints_nothing_and_records_every_epoch(tmp_path, capsys):
    """What notebooks use: no line per epoch (and no record path) in the output; the record is
    complete, so a table printed from it afterwards says everything."""
    from guide_utils.core.config import make_config
    from guide_utils.engine import train

    train(make_config("smoke", epochs=2, mnist1d_samples=400, results_dir=str(tmp_path), progress=False,
                      quiet=True))
    out = capsys.readouterr()
    assert "[train]" not in out.out + out.err and str(tmp_path) not in out.out + out.err
    assert [r["epoch"] for r in _records(tmp_path) if r["type"] == "epoch"] == [1, 2]


def test_quiet_must_be_a_bool():
    from guide_utils.core.config import make_config
    from guide_utils.core.errors import GuideError

    with pytest.raises(GuideError, match="quiet"):
        make_config("smoke", quiet="yes").validate()


def test_gradual_warmup_starts_at_the_warmup_start_batch_rate(tmp_path):
    """One process emulating 8 workers of 32: warmup climbs from 32's rate, not 256's."""
    from guide_utils.core.config import make_config
    from guide_utils.engine import train

    common = dict(epochs=3, per_worker_batch=256, base_lr=0.05, base_batch=32, warmup="gradual", warmup_epochs=2,
                  milestones=(2,), progress=False)
    emulated = train(make_config("smoke", **common, warmup_start_batch=32, results_dir=str(tmp_path / "a")))
    # epoch starts: 0.05 (batch 32's rate), halfway to 0.4, then the drop at epoch 2
    assert [e["lr"] for e in emulated.epochs] == pytest.approx([0.05, 0.225, 0.04])
    plain = train(make_config("smoke", **common, results_dir=str(tmp_path / "b")))
    assert [e["lr"] for e in plain.epochs] == pytest.approx([0.4, 0.4, 0.04])  # start = peak: no warmup at all


def _run(cmd, cwd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env(), cwd=cwd, **kw)


@pytest.mark.slow
def test_chained_runs_equal_one_unbroken_run(tmp_path):
    """The thesis trained its 1-GPU baseline in chunks: 2 epochs, then 2 more, from the checkpoint."""
    common = ["--epochs", "4", "--warmup", "gradual"]
    unbroken = _run([*TRAIN, *common, "--results-dir", "a"], tmp_path)
    assert unbroken.returncode == 0, unbroken.stderr
    chunk = ["--checkpoint-dir", "ckpt", "--results-dir", "b"]
    first = _run([*TRAIN, "--epochs", "2", "--warmup", "gradual", *chunk], tmp_path)
    assert first.returncode == 0, first.stderr
    second = _run([*TRAIN, *common, *chunk], tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resuming checkpoint-epoch0002.pt at epoch 2" in second.stdout
    assert _summary(tmp_path / "b")["weights_digests"] == _summary(tmp_path / "a")["weights_digests"]
    # The chained record's summary means what the unbroken one's does: the best of all epochs.
    assert _summary(tmp_path / "b")["best_val_top1_err"] == _summary(tmp_path / "a")["best_val_top1_err"]


@pytest.mark.slow
def test_preempted_then_resumed_equals_unbroken(tmp_path):
    args = [*TRAIN, "--epochs", "4", "--warmup", "stepping"]
    unbroken = _run([*args, "--results-dir", "a"], tmp_path)
    assert unbroken.returncode == 0, unbroken.stderr

    cmd = [*args, "--results-dir", "b", "--checkpoint-dir", "ckpt"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=tmp_path)
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and not list((tmp_path / "ckpt").glob("checkpoint-epoch0001.pt")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)  # what Slurm sends with --signal=USR1@...
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 75, f"expected the requeue exit status 75, got {proc.returncode}\n{out}\n{err}"
    saved = sorted(p.name for p in (tmp_path / "ckpt").glob("checkpoint-*.pt"))
    assert any("-step" in name for name in saved), saved  # stopped mid-epoch, not at a boundary

    resumed = _run(cmd, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    records = _records(tmp_path / "b")
    assert [r["type"] for r in records].count("resume") == 1
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == [1, 2, 3, 4]
    assert _summary(tmp_path / "b")["weights_digests"] == _summary(tmp_path / "a")["weights_digests"]


def test_without_checkpoints_sigterm_still_stops_the_run(tmp_path):
    """Signals are caught only where a checkpoint can be saved: a run without
    --checkpoint-dir dies of SIGTERM (scancel, the time limit) at once, during start-up too,
    rather than training on unseen."""
    cmd = [*TRAIN, "--epochs", "200", "--results-dir", "r"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=tmp_path)
    time.sleep(0.3)  # still importing torch
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, f"exit {proc.returncode}\n{out}\n{err}"


LAUNCHERS = {
    "horovod-gloo": lambda n: [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo"],
    "horovod-mpi": lambda n: ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none",
                              "-x", "PATH", "-x", "OMP_NUM_THREADS", "-x", "GUIDE_DATA_CACHE"],
    "ddp-torchrun": lambda n: [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n)],
}


def _launch(name: str, n: int, args: list[str]) -> list[str]:
    if name == "horovod-mpi" and shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: sudo apt-get install -y openmpi-bin libopenmpi-dev")
    dist = "ddp" if name.startswith("ddp") else "horovod"
    if name == "ddp-torchrun":
        return [*LAUNCHERS[name](n), "-m", "guide_utils.train", *TRAIN[3:], "--dist", dist, *args]
    return [*LAUNCHERS[name](n), *TRAIN, "--dist", dist, *args]


# Each launcher also trains with one of the large-batch optimizers: Horovod's
# DistributedOptimizer re-creates the optimizer's class around its own, so LARS and LAMB
# must both survive it; DDP only hooks the gradients. (SGD runs under every launcher in
# the Slurm examples and the notebooks.)
OPTIMIZER_FOR = {"horovod-gloo": "lamb", "horovod-mpi": "lars", "ddp-torchrun": "lars"}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_workers_end_with_identical_weights(tmp_path, launcher):
    optimizer = OPTIMIZER_FOR[launcher]
    cmd = _launch(launcher, 2, ["--epochs", "2", "--results-dir", "r", "--optimizer", optimizer])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env(**MPI_AS_ROOT),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = _records(tmp_path / "r")
    assert records[0]["config"]["workers"] == 2 and records[0]["config"]["global_batch"] == 64
    assert records[0]["config"]["optimizer"] == optimizer
    summary = _summary(tmp_path / "r")
    digests = summary["weights_digests"]
    assert len(digests) == 2 and digests[0] == digests[1] and summary["ranks_agree"]
    # 2 x 32 under the linear rule: twice the single-worker learning rate
    assert records[0]["config"]["peak_lr"] == pytest.approx(0.025)


# Rank 1 arrives 2 s late at an allreduce; rank 0 reports what waiting for it cost its own
# thread (the one that waits: Horovod's background thread works on either way).
LATE_PEER = """
import json, time, torch
from guide_utils.engine import distributed
dist = distributed.init("horovod")
if dist.rank == 1:
    time.sleep(2)
wall, cpu = time.monotonic(), time.thread_time()
dist.allreduce_mean(torch.ones(1))
print(json.dumps({"rank": dist.rank, "wall": time.monotonic() - wall, "cpu": time.thread_time() - cpu}))
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_horovod_rank_on_the_cpu_waits_for_a_late_peer_without_spinning(tmp_path):
    """Horovod's own wait polls and yields in a loop, a core's worth of CPU for as long as the
    late rank takes (the 2 s here); on CPUs, which ranks may share, the engine's sleeps
    (engine.hvd_wait). Horovod's own wait took 2.2 CPU-s of the 2 s on the quiet CI machine;
    on a loaded one a spinning thread gets less of a core, so only the bound is checked."""
    proc = subprocess.run([*LAUNCHERS["horovod-gloo"](2), PY, "-c", LATE_PEER], capture_output=True, text=True,
                          timeout=TIMEOUT, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = {r["rank"]: r for r in (json.loads(line.split(">:", 1)[-1]) for line in proc.stdout.splitlines()
                                      if '"rank"' in line)}
    waited = reports[0]
    assert waited["wall"] > 1.5 and waited["cpu"] < 0.1 * waited["wall"], reports


def _worker_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the training processes started under the launcher."""
    import psutil

    ranks = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "guide_utils.train" not in " ".join(child.cmdline()):
                continue
            env = child.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "RANK"):
            if var in env:
                ranks[int(env[var])] = child.pid
                break
    return ranks


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_killed_worker_ends_the_job_within_120_s(tmp_path, launcher):
    cmd = _launch(launcher, 2, ["--epochs", "50", "--results-dir", "r"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env(**MPI_AS_ROOT), cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and not any("epoch" in r["type"] for r in _maybe_records(tmp_path / "r")):
            time.sleep(0.2)
        ranks = _worker_pids(proc.pid)
        assert 1 in ranks, f"rank 1 not found among {ranks}"
        os.kill(ranks[1], signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=150)
        elapsed = time.time() - killed_at
        assert proc.returncode != 0
        assert elapsed < 120, f"the job took {elapsed:.0f} s to notice a dead worker"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _maybe_records(results: Path) -> list[dict]:
    out = []
    for f in results.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_started_the_srun_way_finds_its_rendezvous_from_slurm(tmp_path):
    """Under `srun python -m guide_utils.train --dist ddp` nobody sets MASTER_ADDR/RANK: the
    engine derives them from SLURM_* (first node, port from the job id). Two processes with
    the variables srun would give them must form one job."""
    procs = []
    for rank in (0, 1):
        # What srun sets in each task (measured on the test Slurm): the step's id and size too.
        env = child_env(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost", SLURM_NTASKS="2",
                   SLURM_TASKS_PER_NODE="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0",
                   SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="localhost")
        for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(var, None)
        procs.append(subprocess.Popen([*TRAIN, "--dist", "ddp", "--epochs", "1", "--results-dir", "r"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                      cwd=tmp_path))
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    summary = _summary(tmp_path / "r")
    assert len(summary["weights_digests"]) == 2 and summary["ranks_agree"]


@pytest.mark.slow
def test_performance_switches_run_on_cpu(tmp_path):
    proc = _run([*TRAIN, "--model", "small_resnet", "--data", "synthetic", "--image-size", "32",
                 "--synthetic-size", "256", "--epochs", "1", "--amp", "bf16", "--channels-last",
                 "--results-dir", "r"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in _records(tmp_path / "r") if r["type"] == "epoch"]
    assert rows[0]["images_per_second"] > 0
    assert _records(tmp_path / "r")[0]["config"]["amp"] == "bf16"


@pytest.mark.slow
def test_small_resnet_learns_the_digits(tmp_path):
    proc = _run([*TRAIN, "--model", "small_resnet", "--data", "digits", "--epochs", "3", "--milestones", "30",
                 "--per-worker-batch", "16", "--results-dir", "r"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in _records(tmp_path / "r") if r["type"] == "epoch"]
    assert rows[-1]["val_top1_err"] < 50  # chance is 90%


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for ``sig`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.slow
def test_a_warning_during_start_up_still_ends_in_a_checkpoint(tmp_path):
    """Slurm's USR1 can arrive while Python is still importing torch: the run must not die
    of it (Python's default) but stop at its first step with a checkpoint and exit 75."""
    cmd = [*TRAIN, "--epochs", "2", "--results-dir", "r", "--checkpoint-dir", "ckpt"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=tmp_path)
    # As soon as the early handler is in place (before torch is imported): a fixed delay
    # raced the interpreter's own start on a loaded machine (exit -10, killed by the signal).
    end = time.monotonic() + TIMEOUT
    while not _catches(proc.pid, signal.SIGUSR1) and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 75, f"{proc.returncode}\n{out}\n{err}"
    assert list((tmp_path / "ckpt").glob("checkpoint-*.pt")), "no checkpoint saved"
    resumed = _run([*cmd], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming checkpoint-epoch0000" in resumed.stdout


# The engine outside a Slurm job: what a workstation or a lent GPU machine has.

def test_a_run_outside_slurm_needs_no_python_hostlist(monkeypatch):
    # the GPU check's machine may lack python-hostlist: the engine imports it only in a job
    from guide_utils.engine.bookkeeping import environment

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setitem(sys.modules, "hostlist", None)  # `import hostlist` now raises ImportError
    monkeypatch.delitem(sys.modules, "guide_utils.runtime.slurm", raising=False)
    assert environment("none", 1)["slurm"] is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    with pytest.raises(ImportError):
        environment("none", 1)


def test_the_engine_trains_outside_slurm_without_python_hostlist_or_pandas(tmp_path):
    # What the lent GPU ran into (2026-11-27): the engine imports the launchers, they the
    # Slurm module; only reading a job may need the node-list parser. A fresh interpreter,
    # so every module is imported anew with `import hostlist` failing; the run also reads its
    # own record back without pandas (most of a CPU-second in every training process).
    code = ("import sys; sys.modules['hostlist'] = None\n"
            "import guide_utils.engine, guide_utils.train, guide_utils.runtime.launchers\n"
            "from guide_utils.core.config import make_config\n"
            "from guide_utils.runtime.slurm import SlurmJob\n"
            "assert SlurmJob.from_env({}) is None\n"
            f"cfg = make_config('smoke', epochs=1, mnist1d_samples=400, results_dir={str(tmp_path)!r})\n"
            "result = guide_utils.engine.train(cfg)\n"
            "assert result.completed_epochs == 1 and 'pandas' not in sys.modules, sorted(sys.modules)[:5]\n"
            "try:\n    SlurmJob.from_env({'SLURM_JOB_ID': '7', 'SLURM_JOB_NODELIST': 'n[1-2]'})\n"
            "except ImportError:\n    print('job needs hostlist')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("job needs hostlist"), done.stderr[-2000:]
    (record,) = tmp_path.glob("*.jsonl")
    summary = json.loads(record.read_text().splitlines()[-1])
    assert summary["type"] == "summary" and summary["best_val_top1_err"] is not None
