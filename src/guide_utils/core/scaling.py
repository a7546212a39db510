"""Learning-rate scaling rules and the arithmetic of scaling out.

The linear scaling rule (Goyal et al., 2017) keeps the update per sample constant when the
global batch grows: ``lr = base_lr * global_batch / base_batch``. The thesis took base
learning rate 0.1 for batch 256 (PyTorch-examples' defaults), so 32 GPUs x 128 images get
1.6 and one GPU with 128 images gets 0.05.

>>> scaled_lr(0.1, 256, global_batch(128, 32))
1.6
>>> round(speedup(6104.32, 207.79), 1)
29.4
"""

from __future__ import annotations

import math

RULES = ("none", "linear", "sqrt")


def _positive(name: str, value: float, integer: bool = False) -> None:
    kind = "a positive integer" if integer else "positive"
    if (integer and (not isinstance(value, int) or isinstance(value, bool))) or not value > 0:
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def global_batch(per_worker_batch: int, workers: int) -> int:
    """Images per optimizer step summed over all workers."""
    _positive("per_worker_batch", per_worker_batch, integer=True)
    _positive("workers", workers, integer=True)
    return per_worker_batch * workers


def scaled_lr(base_lr: float, base_batch: int, global_batch: int, rule: str = "linear") -> float:
    """The learning rate for ``global_batch`` given ``base_lr`` tuned at ``base_batch``.

    ``rule``: ``"none"`` keeps ``base_lr`` (the thesis's naive experiment 4), ``"linear"``
    multiplies by ``global_batch / base_batch``, ``"sqrt"`` by its square root.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    _positive("base_lr", base_lr)
    _positive("base_batch", base_batch, integer=True)
    _positive("global_batch", global_batch, integer=True)
    k = global_batch / base_batch
    factor = {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
    # round() removes float noise such as 0.1 * 16 = 1.6000000000000001
    return round(base_lr * factor, 12)


def speedup(throughput: float, baseline_throughput: float) -> float:
    """How many times faster than the baseline (e.g. one GPU)."""
    _positive("throughput", throughput)
    _positive("baseline_throughput", baseline_throughput)
    return throughput / baseline_throughput


def efficiency(throughput: float, baseline_throughput: float, workers: int) -> float:
    """Speedup per worker: 1.0 is perfect linear scaling."""
    _positive("workers", workers, integer=True)
    return speedup(throughput, baseline_throughput) / workers


IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC 2012 training set, the thesis's dataset


def training_hours(images_per_second: float, *, epochs: int = 90,
                   images_per_epoch: int = IMAGENET_TRAIN_IMAGES) -> float:
    """Wall-clock hours to see ``epochs`` passes at a steady ``images_per_second``.

    A lower bound: validation, start-up and slow first batches come on top (the thesis's
    32 x 128 run measured 6104 img/s, i.e. 5.2 h of pure training, and took 6 h 36 min).
    """
    _positive("images_per_second", images_per_second)
    _positive("epochs", epochs, integer=True)
    return epochs * images_per_epoch / images_per_second / 3600


def gpu_hours(wall_hours: float, workers: int) -> float:
    """What an allocation is charged for: every GPU for the whole wall-clock time."""
    _positive("wall_hours", wall_hours)
    _positive("workers", workers, integer=True)
    return wall_hours * workers
