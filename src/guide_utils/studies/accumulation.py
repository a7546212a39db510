"""Gradient accumulation shown in one process: N micro-batches of b per optimizer step
against one batch of N x b (chapter 17).

:func:`compare` trains one small problem both ways through the engine, for a model without
BatchNorm and for one with it, and measures how far apart the final weights are. Without
BatchNorm the two are the same computation up to the order of float sums; with it they are
not, since each micro-batch is normalised by its own statistics. The tests
(``tests/test_accumulation.py``) check the same equality with two workers under Horovod and
DDP, and a 4-worker checkpoint continued on 2 workers.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

# MNIST-1D with 800 training samples, one epoch: two small models train it in about a second.
SETTINGS = {"mnist1d_samples": 1000, "epochs": 1, "base_lr": 0.1, "base_batch": 32, "progress": False,
            "quiet": True}


def _weights(checkpoint_dir: Path) -> dict:
    import torch

    from ..engine import checkpoint

    newest = checkpoint.checkpoints(checkpoint_dir)[0][2]
    return torch.load(newest, map_location="cpu", weights_only=True)["model"]


def relative_difference(a: dict, b: dict) -> float:
    """The largest difference between two state dicts' floating-point tensors (weights, and
    BatchNorm's running statistics), each relative to its own largest value (float32 rounding:
    about 1e-7; a different computation: far more).

    >>> import torch
    >>> relative_difference({"w": torch.tensor([4.0, 1.0]), "n": torch.tensor(25)},
    ...                     {"w": torch.tensor([4.0, 1.5]), "n": torch.tensor(100)})
    0.125
    """
    worst = 0.0
    for name, want in a.items():
        if not want.is_floating_point():  # BatchNorm's count of batches: one per micro-batch
            continue
        scale = float(want.abs().max()) or 1.0
        worst = max(worst, float((b[name].float() - want.float()).abs().max()) / scale)
    return round(worst, 12)


def compare(results_dir: str | Path, *, micro_batch: int = 8, accumulate_steps: int = 4,
            models: tuple[str, ...] = ("mnist1d_mlp", "mnist1d_cnn"), seed: int = 0) -> list[dict[str, Any]]:
    """For each model, one run stepping on batches of ``micro_batch x accumulate_steps`` and one
    adding ``accumulate_steps`` micro-batches' gradients per step. Rows: the model, the run,
    its global batch, learning rate and optimizer steps per epoch, its final training loss,
    and how far its final weights are from the one-batch run's (``relative_difference``)."""
    from ..core.config import make_config
    from ..core.records import read_run
    from ..engine import train

    Path(results_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for model in models:
        reference = None
        for label, batch, n in (("one batch", micro_batch * accumulate_steps, 1),
                                (f"{accumulate_steps} micro-batches", micro_batch, accumulate_steps)):
            name = f"accumulate-{model}-{batch}x{n}-seed{seed}"
            checkpoints = Path(tempfile.mkdtemp(prefix=f"{name}-checkpoints-", dir=results_dir))  # fresh: no resume
            cfg = make_config("smoke", **SETTINGS, model=model, per_worker_batch=batch, accumulate_steps=n, seed=seed,
                              results_dir=str(results_dir), run_name=name, checkpoint_dir=str(checkpoints))
            result = train(cfg)
            weights = _weights(checkpoints)
            reference = reference or weights
            steps = read_run(result.record_path).config["steps_per_epoch"]
            rows.append({"model": model, "run": f"{label} of {batch}", "global_batch": batch * n,
                         "steps_per_epoch": steps, "lr": result.epochs[-1]["lr"],
                         "loss": round(result.epochs[-1]["loss"], 4),
                         "weights_differ_by": relative_difference(reference, weights)})
    return rows
