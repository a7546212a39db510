"""Chapter 14's pitfalls that take more than a notebook cell: each test shows the symptom
and the fix as a user meets them, with the real launchers and the real engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN, child_env
from guide_utils.studies import pitfalls

PY = sys.executable
TRAIN = ["-m", "guide_utils.train", "--profile", "smoke", "--epochs", "1", "--no-progress"]
DISAGREE = "the ranks planned different numbers of steps per epoch (rank 0: 25, rank 1: 30)"


def test_without_set_epoch_every_epoch_repeats_the_same_order():
    same = pitfalls.sampler_orders(set_epoch=False, epochs=3)
    fixed = pitfalls.sampler_orders(set_epoch=True, epochs=3)
    assert same[0] == same[1] == same[2]
    assert fixed[0] == same[0] and fixed[1] != fixed[0] and fixed[2] not in (fixed[0], fixed[1])
    assert sorted(fixed[1]) != sorted(pitfalls.sampler_orders(set_epoch=True, rank=1)[1])  # shards still disjoint


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_rank_with_more_steps_waits_in_an_allreduce_nobody_joins():
    """The symptom without the engine's check: the rank with the extra step waits until
    the process group's timeout (here 3 s; PyTorch's default for Gloo is 30 minutes)."""
    short, long_ = pitfalls.uneven_steps((3, 4), timeout_s=3.0)
    assert short["outcome"] == "finished its steps"
    assert long_["outcome"].startswith("RuntimeError") and "Timed out" in long_["outcome"]
    assert long_["seconds"] >= 3.0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_engine_refuses_ranks_that_disagree_on_steps_under_ddp(tmp_path):
    """Rank 1 sees 2,400 MNIST-1D samples, rank 0 2,000: 30 against 25 steps per epoch.
    Instead of hanging at the end of the first epoch, every rank stops before the first step
    with one line that names the cause."""
    args = [*TRAIN[2:], "--dist", "ddp", "--results-dir", str(tmp_path)]
    ranks = pitfalls.launch_per_rank([[*args, "--mnist1d-samples", "2000"], [*args, "--mnist1d-samples", "2400"]],
                                     timeout=240)
    for rank in ranks:
        assert rank["returncode"] == 2, ranks
        assert DISAGREE in rank["last_error_line"], ranks
    assert not list(tmp_path.glob("*.jsonl"))  # nothing was trained or recorded


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_engine_refuses_ranks_that_disagree_on_steps_under_horovod(tmp_path):
    # Each rank's own --mnist1d-samples, from the rank horovodrun gives it.
    train = " ".join([PY, *TRAIN, "--dist", "horovod", "--results-dir", str(tmp_path)])
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", "sh", "-c",
           f"exec {train} --mnist1d-samples $((2000 + 400 * HOROVOD_RANK))"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode != 0
    assert DISAGREE in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert time.time() - start < 240


def _horovod_without_pytorch(tmp_path: Path) -> Path:
    """A copy of this Horovod, as links, without its PyTorch extension: what a build that
    did not find PyTorch (HOROVOD_WITH_PYTORCH unset, torch installed after) leaves."""
    import horovod

    src = Path(horovod.__file__).parent
    dst = tmp_path / "site" / "horovod"
    for path in src.rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(src)
        if rel.parts[0] == "torch" and path.name.startswith("mpi_lib"):
            continue  # the compiled PyTorch extension
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).symlink_to(path)
    return dst.parent


@pytest.mark.slow
def test_a_horovod_built_without_pytorch_is_named_by_the_doctor_not_by_check_build(tmp_path):
    if shutil.which("horovodrun", path=str(BIN)) is None:
        pytest.skip("Horovod is not installed here: run scripts/setup.sh")
    env = child_env(PYTHONPATH=f"{_horovod_without_pytorch(tmp_path)}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    # Horovod 0.28.1's PyTorch binding imports without its extension (it prints a warning),
    # and --check-build only tries the import: it still ticks PyTorch.
    check = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True, text=True, timeout=240,
                           env=env)
    assert check.returncode == 0 and "[X] PyTorch" in check.stdout, check.stdout + check.stderr[-2000:]
    # The doctor looks for the operations themselves and names the fix.
    doctor = subprocess.run([PY, "-m", "guide_utils", "doctor", "--dist", "horovod"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert doctor.returncode == 1, doctor.stdout
    assert "[ ] PyTorch" in doctor.stdout
    assert "PROBLEM: Horovod was built without PyTorch support" in doctor.stdout and "--dist ddp" in doctor.stdout
    assert "stack usable: NO" in doctor.stdout
    # And a job that tries anyway stops with the same cause in one line, not an AttributeError.
    train = subprocess.run([str(BIN / "horovodrun"), "-np", "1", "-H", "localhost:1", "--gloo", PY, *TRAIN,
                            "--dist", "horovod", "--results-dir", str(tmp_path / "r")],
                           capture_output=True, text=True, timeout=240, env=env)
    assert train.returncode != 0 and "built without its PyTorch extension" in train.stdout + train.stderr
    assert "AttributeError" not in train.stdout + train.stderr


def test_a_taken_rendezvous_port_is_the_error_a_second_job_sees():
    assert "EADDRINUSE" in pitfalls.port_collision()


def test_each_rank_takes_its_own_gpu_whatever_the_binding(monkeypatch):
    """GPU-only pitfall, checked without a GPU: set_device with the local rank when every
    task sees all GPUs, GPU 0 when srun binds one GPU per task (CUDA_VISIBLE_DEVICES)."""
    import torch

    from guide_utils.engine import distributed

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for visible, local_rank, expect in ((4, 3, 3), (1, 3, 0), (4, 0, 0)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda v=visible: v)
        assert distributed._pick_device(local_rank) == torch.device("cuda", expect)
        assert chosen[-1] == expect


def test_small_per_worker_batches_give_batchnorm_noisier_statistics():
    rows = pitfalls.batchnorm_spread([4, 32, 256])
    dev = [r["relative_deviation"] for r in rows]
    assert dev[0] > dev[1] > dev[2] > 0 and dev[0] > 2 * dev[1]
