"""Gradient accumulation (``--accumulate-steps N``): N micro-batches of b per optimizer step
equal one batch of N x b, alone, under Horovod and under DDP; a checkpoint of 4 workers
continues on 2 workers with N = 2 like an unbroken 4-worker run; bad values are one line.

Every equality here trains ``mnist1d_mlp``, a model without BatchNorm. With BatchNorm the
equality cannot hold: in training mode each micro-batch is normalised by its own mean and
variance (and updates the running statistics once per micro-batch), so b samples at a time
are a different computation from N x b at once. Without it, a batch's loss is the mean of its
samples' losses, and dividing each micro-batch's loss by N makes the sum of the N gradients
the gradient of the mean over N x b samples: the same step, up to the order of float sums.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import MPI_AS_ROOT, child_env
from test_engine import TIMEOUT, _launch, _records, _summary

# float32 sums in another order: a few ulps per step; 2 epochs of 25 steps stay far inside this
RTOL, ATOL = 1e-5, 1e-7
# 800 training samples: 25 optimizer steps of a global batch of 32 per epoch; lr 0.1 at batch 32
SMALL = dict(model="mnist1d_mlp", mnist1d_samples=1000, epochs=2, base_lr=0.1, base_batch=32)
SMALL_ARGS = ["--model", "mnist1d_mlp", "--mnist1d-samples", "1000", "--base-lr", "0.1", "--base-batch", "32"]


def _weights(checkpoints: Path) -> dict:
    """The model weights of the newest checkpoint in ``checkpoints`` (written by rank 0)."""
    import torch

    newest = sorted(checkpoints.glob("checkpoint-*.pt"))[-1]
    return torch.load(newest, map_location="cpu", weights_only=True)["model"]


def _assert_close(got: dict, want: dict) -> None:
    import torch

    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=ATOL, msg=name)


def _train_alone(tmp_path: Path, name: str, **settings):
    from guide_utils.core.config import make_config
    from guide_utils.engine import train

    cfg = make_config("smoke", **{**SMALL, **settings}, results_dir=str(tmp_path / name / "r"),
                      checkpoint_dir=str(tmp_path / name / "ckpt"), progress=False, quiet=True)
    return train(cfg), _weights(tmp_path / name / "ckpt")


@pytest.fixture(scope="module")
def one_big_batch(tmp_path_factory):
    """The reference: one process, one optimizer step per batch of 32."""
    return _train_alone(tmp_path_factory.mktemp("big"), "big", per_worker_batch=32)


@pytest.mark.slow
def test_micro_batches_equal_one_big_batch_in_one_process(tmp_path, one_big_batch):
    """4 micro-batches of 8, gradients added, then one step: the weights of one step of 32."""
    big, want = one_big_batch
    small, got = _train_alone(tmp_path, "micro", per_worker_batch=8, accumulate_steps=4)
    _assert_close(got, want)
    config = _records(tmp_path / "micro" / "r")[0]["config"]
    assert config["global_batch"] == 32 and config["steps_per_epoch"] == 25 and config["accumulate_steps"] == 4
    assert [e["lr"] for e in small.epochs] == [e["lr"] for e in big.epochs]
    # the run learned (chance: 2.30), so the equality is not that of two runs that did nothing
    assert small.epochs[-1]["loss"] < 2.0


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod-gloo", "ddp-torchrun"])
def test_two_workers_accumulating_equal_one_big_batch(tmp_path, launcher, one_big_batch):
    """2 workers x 8 x 2 micro-steps (Horovod: backward_passes_per_step=2; DDP: no_sync on the
    first) equal one process stepping on 32: each step covers the same 32 samples, since the
    sampler deals the epoch's permutation to the ranks in turn, and the averaged gradient of
    two ranks' two halved micro-batch gradients is the mean over those 32."""
    _, want = one_big_batch
    cmd = _launch(launcher, 2, [*SMALL_ARGS, "--epochs", "2", "--per-worker-batch", "8", "--accumulate-steps", "2",
                                "--results-dir", "r", "--checkpoint-dir", "ckpt"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env(**MPI_AS_ROOT),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = _records(tmp_path / "r")[0]["config"]
    assert (config["workers"], config["global_batch"], config["steps_per_epoch"]) == (2, 32, 25)
    summary = _summary(tmp_path / "r")
    assert summary["ranks_agree"] and len(summary["weights_digests"]) == 2
    _assert_close(_weights(tmp_path / "ckpt"), want)


HOROVOD = "horovod-gloo"
FOUR_WORKERS = [*SMALL_ARGS, "--per-worker-batch", "8", "--warmup", "gradual", "--warmup-epochs", "1",
                "--milestones", "1"]


def _horovod(tmp_path: Path, n: int, args: list[str]) -> subprocess.CompletedProcess:
    cmd = _launch(HOROVOD, n, args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env(**MPI_AS_ROOT),
                          cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_4_worker_checkpoint_continues_on_2_workers_accumulating_2(tmp_path):
    """The checkpoint of epoch 1 of a run on 4 workers x 8 (global batch 32) continues on 2
    workers x 8 x 2 (the same global batch): from epoch 1, at the unbroken run's learning rate
    (gradual warmup over epoch 1, the milestone's drop at epoch 1), to the unbroken run's
    weights within float rounding: each optimizer step covers the same 32 samples in both (see
    the test above), only the sums are taken in another order."""
    unbroken = _horovod(tmp_path, 4, [*FOUR_WORKERS, "--epochs", "2", "--results-dir", "a",
                                      "--checkpoint-dir", "ckpt-a"])
    assert unbroken.returncode == 0, unbroken.stdout[-3000:] + unbroken.stderr[-3000:]
    (tmp_path / "ckpt").mkdir()
    shutil.copy(tmp_path / "ckpt-a" / "checkpoint-epoch0001.pt", tmp_path / "ckpt")  # what 4 workers left

    # Fewer workers without accumulation would change the global batch, its lr and its
    # schedule: refused in one line that names the fix (checked in this process: no launch).
    from guide_utils.core.config import make_config
    from guide_utils.core.errors import GuideError
    from guide_utils.engine import train

    with pytest.raises(GuideError, match=r"4 worker\(s\) x 8 = global batch 32, this run has 1 x 8 = 8.*"
                                         r"--accumulate-steps 4"):
        train(make_config("smoke", **{**SMALL, "per_worker_batch": 8}, checkpoint_dir=str(tmp_path / "ckpt"),
                          results_dir=str(tmp_path / "refused"), progress=False, quiet=True))
    assert not (tmp_path / "refused").exists()

    resumed = _horovod(tmp_path, 2, [*FOUR_WORKERS, "--accumulate-steps", "2", "--epochs", "2", "--results-dir", "b",
                                     "--checkpoint-dir", "ckpt"])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming checkpoint-epoch0001.pt at epoch 1" in resumed.stdout
    config = _records(tmp_path / "b")[0]["config"]
    assert (config["workers"], config["accumulate_steps"], config["global_batch"]) == (2, 2, 32)
    continued = [r for r in _records(tmp_path / "b") if r["type"] == "epoch"]
    straight = [r for r in _records(tmp_path / "a") if r["type"] == "epoch"]
    assert [r["epoch"] for r in continued] == [2] and [r["epoch"] for r in straight] == [1, 2]
    assert straight[0]["lr"] == pytest.approx(0.025)  # warmup from batch 8's rate (0.1 x 8 / 32)
    assert continued[0]["lr"] == pytest.approx(straight[1]["lr"], rel=1e-12)
    assert straight[1]["lr"] == pytest.approx(0.1 * 0.1)  # the peak rate of batch 32, dropped at milestone 1
    _assert_close(_weights(tmp_path / "ckpt"), _weights(tmp_path / "ckpt-a"))
    assert continued[0]["val_loss"] == pytest.approx(straight[1]["val_loss"], rel=1e-4)


def test_ddp_reduces_once_per_optimizer_step():
    """Under DDP the first N - 1 micro-batches run under ``no_sync()``: one allreduce per
    optimizer step, not N. The equality tests cannot see this (averaging is linear, so N
    reductions add up to the same gradient); the communication would be N times as much.
    Counted with a communication hook on a one-rank Gloo group in this process."""
    import contextlib

    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    from guide_utils.engine import loop, metrics, state
    from guide_utils.runtime.ports import free_port

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        ddp = DistributedDataParallel(module)
        reduced = []

        def count(_, bucket):
            reduced.append(bucket.index())
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        ddp.register_comm_hook(None, count)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        st = state.TrainingState(model=ddp, module=module, wrapped=ddp, optimizer=optimizer,
                                 scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), scaler=None,
                                 memory_format=torch.contiguous_format, autocast=contextlib.nullcontext, meta={})
        batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(6)]
        for step in range(2):
            loop._step(st, torch.nn.CrossEntropyLoss(), iter(batches[3 * step:3 * step + 3]), 3,
                       metrics.Sums(torch.device("cpu")))
        assert reduced == [0, 0], "one bucket, reduced once in each of the 2 steps of 3 micro-batches"
    finally:
        tdist.destroy_process_group()


def _loaded(position: int, **meta):
    from guide_utils.engine.checkpoint import LoadedCheckpoint

    state = {"position": position, "meta": {"model": "mnist1d_mlp", **meta}}
    return LoadedCheckpoint(Path("ckpt/checkpoint-epoch0003-step0000005.pt"), state, 3, 5)


def _plan(workers: int, batch: int, accumulate: int = 1):
    from guide_utils.core.config import make_config
    from guide_utils.engine.plan import RunPlan

    cfg = make_config("smoke", per_worker_batch=batch, accumulate_steps=accumulate)
    return RunPlan.make(cfg, workers=workers, samples_per_worker=3200 // workers)


def test_a_mid_epoch_position_carries_over_as_the_optimizer_step():
    """Stopped after step 5 of 4 workers x 8 (position 40 in each shard of 800): 2 workers x 8
    x 2 resume at position 80 of theirs, 1 x 32 at 160: step 5 either way."""
    from guide_utils.engine.state import _start_position

    four = _loaded(40, workers=4, per_worker_batch=8, global_batch=32)
    assert _start_position(four, _plan(2, 8, 2)) == 80
    assert _start_position(four, _plan(1, 32)) == 160
    assert _start_position(four, _plan(4, 8)) == 40
    # checkpoints written before accumulation existed have no global_batch: workers x batch
    assert _start_position(_loaded(40, workers=4, per_worker_batch=8), _plan(1, 8, 4)) == 160


@pytest.mark.parametrize("workers, batch, accumulate, hint", [
    (2, 8, 1, "keep the global batch with --accumulate-steps 2"),
    (2, 12, 1, "keep the global batch with --per-worker-batch 16 (or --per-worker-batch 8 --accumulate-steps 2)"),
    (3, 8, 1, "no split of global batch 32 over 3 workers is whole"),
    (4, 8, 2, "keep the global batch with --accumulate-steps 1"),
])
def test_a_different_global_batch_is_refused_with_the_fix(workers, batch, accumulate, hint):
    from guide_utils.core.errors import GuideError
    from guide_utils.engine.state import _start_position

    four = _loaded(0, workers=4, per_worker_batch=8, global_batch=32)
    with pytest.raises(GuideError) as err:
        _start_position(four, _plan(workers, batch, accumulate))
    message = str(err.value)
    assert "\n" not in message and hint in message and "global batch 32" in message, message


@pytest.mark.parametrize("value", [0, -2, True, 1.5])
def test_accumulate_steps_must_be_a_positive_integer(value):
    from guide_utils.core.config import make_config
    from guide_utils.core.errors import GuideError

    with pytest.raises(GuideError, match=r"--accumulate-steps must be a positive integer"):
        make_config("smoke", accumulate_steps=value).validate()


def test_a_step_larger_than_a_shard_is_refused():
    """800 samples per worker cannot make one step of 4 x 256: one line naming all three."""
    from guide_utils.core.config import make_config
    from guide_utils.core.errors import GuideError
    from guide_utils.engine.plan import RunPlan

    cfg = make_config("smoke", per_worker_batch=256, accumulate_steps=4)
    with pytest.raises(GuideError, match=r"each of 4 worker\(s\) gets 800 samples, fewer than one optimizer step "
                                         r"of 4 x 256 = 1024 \(--per-worker-batch 256 --accumulate-steps 4\)"):
        RunPlan.make(cfg, workers=4, samples_per_worker=800)
