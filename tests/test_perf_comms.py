"""``python -m guide_utils comms`` on real worker processes: every runtime this machine has,
the nccl-tests definitions of algbw and busbw, the gradient-list knobs, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BIN, child_env
from guide_utils.perf import comms

PY = sys.executable
SIZES = [4, 16, 64, 256, 1024, 4096, 16384, 65536]
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _comms(*args: str, cmd: list[str] | None = None, timeout: float = 300):
    return subprocess.run([*(cmd or [PY, "-m", "guide_utils"]), "comms", *args], capture_output=True, text=True,
                          env=child_env(), timeout=timeout)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """One local run of three runtimes, 2 workers each (started by the command itself)."""
    out = tmp_path_factory.mktemp("comms") / "rows.jsonl"
    proc = _comms("--runtime", "horovod-gloo", "horovod-mpi", "torch-gloo", "--max-bytes", "64K", "--budget", "1M",
                  "--model", "small_resnet", "--ddp-buckets", "1", "25", "--iters", "2", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows == comms.read_rows(out), "--json and --out must carry the same rows"
    return rows


def test_every_runtime_covers_every_size_with_correct_sums(local):
    for runtime in ("horovod-gloo", "horovod-mpi", "torch-gloo"):
        sweep = [r for r in local if r["kind"] == "allreduce" and r["runtime"] == runtime]
        assert [r["bytes"] for r in sweep] == SIZES, runtime
        assert all(r["correct"] and r["workers"] == 2 and r["iters"] >= 3 for r in sweep), sweep


def test_bandwidths_follow_the_nccl_tests_definitions(local):
    measured = [r for r in local if r["kind"] in ("allreduce", "gradients")]
    assert measured
    for r in measured:
        n = r["workers"]
        assert r["time_s"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9, rel=1e-12)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (n - 1) / n, rel=1e-12)


def test_the_gradient_list_is_measured_every_way(local):
    grads = [r for r in local if r["kind"] == "gradients"]
    params = sum(__import__("math").prod(s) for s in comms.gradient_shapes("small_resnet"))
    assert all(r["bytes"] == 4 * params and r["tensors"] == 29 for r in grads)
    for runtime in ("horovod-gloo", "horovod-mpi", "torch-gloo"):
        methods = {r["method"] for r in grads if r["runtime"] == runtime}
        assert {"one-by-one", "async-all", "async-all-fp16", "one-buffer"} <= methods, (runtime, methods)
    ddp = [r for r in grads if r["method"].startswith("ddp-bucket")]
    assert sorted(r["bucket_cap_mb"] for r in ddp) == [1, 25]
    assert all(r["step_s"] >= r["local_step_s"] * 0 and r["runtime"] == "torch-gloo" for r in ddp)
    horovod = [r for r in grads if r["runtime"].startswith("horovod")]
    assert {(r["fusion_threshold_bytes"], r["cycle_time_ms"]) for r in horovod} == {(128 * 2**20, 1.0)}


def test_under_a_launcher_every_process_is_one_worker():
    launcher = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, "-m", "guide_utils"]
    proc = _comms("--experiments", "sizes", "gradients", "--max-bytes", "64", "--model", "small_resnet", "--iters",
                  "1", "--fusion-threshold", "0", "--cycle-time", "5", "--json", cmd=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line.split(">:", 1)[-1]) for line in proc.stdout.splitlines() if "{" in line]
    assert [r["kind"] for r in rows].count("meta") == 1, "rank 0 alone reports"
    sweep = [r for r in rows if r["kind"] == "allreduce"]
    assert [r["bytes"] for r in sweep] == [4, 16, 64] and {r["runtime"] for r in sweep} == {"horovod-gloo"}
    grads = [r for r in rows if r["kind"] == "gradients"]
    assert grads and all((r["fusion_threshold_bytes"], r["cycle_time_ms"]) == (0, 5.0) for r in grads)


@pytest.mark.parametrize("args, message", [
    (["--runtime", "nccl"], "unknown --runtime 'nccl'; choose from horovod-gloo"),
    (["--runtime", "torch-mpi"], "--runtime torch-mpi: this PyTorch was built without MPI"),
    (["--min-bytes", "1M", "--max-bytes", "4"], "--min-bytes 1048576 is larger than --max-bytes 4"),
    (["--max-bytes", "12 parsecs"], "--max-bytes '12 parsecs' is not a size"),
    (["--fusion-threshold", "lots"], "--fusion-threshold 'lots' is not a size"),
    (["--workers", "0"], "--workers must be 1 or more"),
])
def test_bad_input_is_one_line(args, message):
    proc = _comms(*args, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


def test_nccl_without_gpus_says_why():
    reason = comms.unavailable("torch-nccl", 2)
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    assert reason.startswith("NCCL needs NVIDIA GPUs")
