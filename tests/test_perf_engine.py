"""The engine switches the performance chapters tune: DDP's bucket size and fp16 compression
hook, Horovod's tensor fusion settings, and pre-decoded image shards as a data format. Each
must still train correctly (ranks end with the same weights) and record what it used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from guide_utils.core.records import read_runs

PY = sys.executable
BIN = Path(PY).parent
SMOKE = ["--profile", "smoke", "--epochs", "1", "--max-steps-per-epoch", "4", "--mnist1d-samples", "400",
         "--no-progress"]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_with_small_buckets_and_fp16_compression_keeps_ranks_in_step(tmp_path):
    proc = _run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "guide_utils.train", *SMOKE,
                 "--dist", "ddp", "--ddp-bucket-mb", "0.01", "--fp16-allreduce", "--results-dir", "r"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = read_runs(tmp_path / "r")
    assert run.summary["ranks_agree"] and len(run.summary["weights_digests"]) == 2
    assert (run.config["ddp_bucket_mb"], run.config["fp16_allreduce"]) == (0.01, True)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_horovod_tensor_fusion_settings_reach_horovod(tmp_path):
    proc = _run([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, "-m", "guide_utils.train",
                 *SMOKE, "--dist", "horovod", "--fusion-threshold-mb", "0", "--cycle-time-ms", "5",
                 "--results-dir", "r"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = read_runs(tmp_path / "r")
    assert run.summary["ranks_agree"]
    env = run.environment
    assert (env["horovod_fusion_threshold_bytes"], env["horovod_cycle_time_ms"]) == (0, 5.0)


@pytest.mark.parametrize("flags, message", [
    (["--ddp-bucket-mb", "0"], "--ddp-bucket-mb must be positive"),
    (["--fusion-threshold-mb", "-1"], "--fusion-threshold-mb must be 0 (no fusion) or more"),
    (["--cycle-time-ms", "0"], "--cycle-time-ms is in milliseconds"),
])
def test_bad_switch_values_are_one_line(tmp_path, flags, message):
    proc = _run([PY, "-m", "guide_utils.train", *SMOKE, *flags], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_the_engine_trains_on_pre_decoded_shards(tmp_path):
    from guide_utils.data.datasets import make_jpeg_folder, write_shards

    shards = write_shards(make_jpeg_folder(tmp_path / "jpeg", per_class=8, val_per_class=4, size=64),
                          tmp_path / "shards", image_size=40)
    proc = _run([PY, "-m", "guide_utils.train", "--profile", "smoke", "--model", "small_resnet", "--data", str(shards),
                 "--image-size", "32", "--per-worker-batch", "4", "--epochs", "1", "--no-progress",
                 "--results-dir", "r"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = read_runs(tmp_path / "r")
    assert run.epochs["epoch"].tolist() == [1]
    assert run.config["data"].startswith("shards: 16 train / 8 val samples, 2 classes")
    too_big = _run([PY, "-m", "guide_utils.train", "--profile", "smoke", "--model", "small_resnet", "--data",
                    str(shards), "--image-size", "64", "--epochs", "1", "--no-progress"], tmp_path)
    assert too_big.returncode == 2 and "larger than the shards' stored 40 px" in too_big.stderr
