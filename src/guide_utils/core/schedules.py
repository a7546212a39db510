"""Learning-rate schedules: warmup, then step drops, as one function of a (float) epoch.

``lr_at(epoch, ...)`` is the single definition; the adapters below drive a PyTorch optimizer
or a Keras model from it, so every framework sees the same numbers. The epoch is a float:
``e + i / steps_per_epoch`` at iteration ``i`` of epoch ``e``, which makes gradual warmup a
per-iteration ramp. At integer epochs the values equal the thesis's pseudocode:

* stepping warmup (Appendix 9): ``peak * (e + 1) / (W + 1)`` for ``e < W``, constant within
  an epoch;
* gradual warmup (Appendix 13): ``start + (peak - start) * e / W`` for ``e < W``, where
  ``start`` is the single-worker learning rate;

then ``peak``, multiplied by ``gamma`` at each milestone (30, 60, 80).

>>> [round(lr_at(e, peak_lr=1.6, warmup="stepping"), 4) for e in range(6)]
[0.2667, 0.5333, 0.8, 1.0667, 1.3333, 1.6]
>>> [round(lr_at(e, peak_lr=1.6, warmup="gradual", warmup_start_lr=0.05), 2) for e in range(6)]
[0.05, 0.36, 0.67, 0.98, 1.29, 1.6]
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Sequence

WARMUPS = ("none", "stepping", "gradual")


def _check(epoch: float, peak_lr: float, warmup: str, warmup_epochs: int, warmup_start_lr: float | None,
           milestones: Sequence[int], gamma: float) -> None:
    if not (isinstance(epoch, (int, float)) and epoch >= 0 and math.isfinite(epoch)):
        raise ValueError(f"epoch must be a non-negative number, got {epoch!r}")
    if not peak_lr > 0:
        raise ValueError(f"peak_lr must be positive, got {peak_lr!r}")
    if warmup not in WARMUPS:
        raise ValueError(f"warmup must be one of {', '.join(WARMUPS)}, got {warmup!r}")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    if any(m < 0 for m in milestones) or any(b <= a for a, b in zip(milestones, milestones[1:])):
        raise ValueError(f"milestones must be non-negative and strictly increasing, got {list(milestones)}")
    if warmup == "none":
        return
    if not (isinstance(warmup_epochs, int) and warmup_epochs > 0):
        raise ValueError(f"warmup_epochs must be a positive integer, got {warmup_epochs!r}")
    if milestones and warmup_epochs > milestones[0]:
        raise ValueError(f"warmup_epochs ({warmup_epochs}) must not exceed the first milestone ({milestones[0]})")
    if warmup == "gradual":
        if warmup_start_lr is None:
            raise ValueError("warmup_start_lr is required for gradual warmup (the single-worker learning rate)")
        if not 0 <= warmup_start_lr <= peak_lr:
            raise ValueError(f"warmup_start_lr must be between 0 and peak_lr ({peak_lr}), got {warmup_start_lr!r}")


def lr_at(epoch: float, *, peak_lr: float, warmup: str = "none", warmup_epochs: int = 5,
          warmup_start_lr: float | None = None, milestones: Sequence[int] = (30, 60, 80),
          gamma: float = 0.1) -> float:
    """The learning rate at (float) ``epoch``; see the module docstring."""
    milestones = tuple(milestones)
    _check(epoch, peak_lr, warmup, warmup_epochs, warmup_start_lr, milestones, gamma)
    return _lr(epoch, peak_lr, warmup, warmup_epochs, warmup_start_lr, milestones, gamma)


def _lr(epoch: float, peak_lr: float, warmup: str, warmup_epochs: int, warmup_start_lr: float | None,
        milestones: tuple[int, ...], gamma: float) -> float:
    """``lr_at`` for settings already checked: what a scheduler calls at every step."""
    if warmup == "stepping" and epoch < warmup_epochs:
        return peak_lr * (math.floor(epoch) + 1) / (warmup_epochs + 1)
    if warmup == "gradual" and epoch < warmup_epochs:
        return warmup_start_lr + (peak_lr - warmup_start_lr) * epoch / warmup_epochs
    drops = sum(1 for m in milestones if epoch >= m)
    return peak_lr * gamma**drops


def schedule_table(epochs: int, **schedule: Any) -> list[tuple[int, float]]:
    """``(epoch, lr)`` at the start of each epoch, for printing and plotting."""
    if not (isinstance(epochs, int) and epochs > 0):
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    return [(e, lr_at(e, **schedule)) for e in range(epochs)]


def torch_scheduler(optimizer, *, steps_per_epoch: int, start_epoch: int = 0, **schedule: Any):
    """A ``torch.optim.lr_scheduler.LambdaLR`` that follows ``lr_at`` per iteration.

    Call ``scheduler.step()`` after every ``optimizer.step()``. The optimizer's learning
    rate is set to ``peak_lr`` here (LambdaLR multiplies the initial rate by the factor),
    so a caller cannot forget it. ``state_dict()``/``load_state_dict()`` resume the position.
    """
    from torch.optim.lr_scheduler import LambdaLR

    if not (isinstance(steps_per_epoch, int) and steps_per_epoch > 0):
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch!r}")
    peak = schedule["peak_lr"]
    lr_at(0.0, **schedule)  # validate now, once, not at every step
    bound = inspect.signature(lr_at).bind(0.0, **schedule)  # lr_at's defaults, written once there
    bound.apply_defaults()
    settings = {**bound.arguments, "milestones": tuple(bound.arguments["milestones"])}
    del settings["epoch"]
    for group in optimizer.param_groups:
        group["lr"] = peak
        group["initial_lr"] = peak
    offset = start_epoch * steps_per_epoch
    return LambdaLR(optimizer, lambda it: _lr((it + offset) / steps_per_epoch, **settings) / peak)


def keras_callback(*, steps_per_epoch: int, **schedule: Any):
    """A Keras callback setting the optimizer's learning rate from ``lr_at`` before every batch.

    Why not Horovod's ``LearningRateWarmupCallback``? Its ramp (from ``peak/size`` to
    ``peak``) is this module's gradual warmup, but evaluated one iteration ahead
    (``epoch + (batch + 1) / steps``), and it also rescales momentum while the rate changes,
    so its numbers differ from ``lr_at``. This callback gives exactly ``lr_at``'s values.
    """
    import tensorflow as tf

    if not (isinstance(steps_per_epoch, int) and steps_per_epoch > 0):
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch!r}")
    lr_at(0.0, **schedule)

    class LearningRateFromSchedule(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            lr = lr_at(self.epoch + batch / steps_per_epoch, **schedule)
            tf.keras.backend.set_value(self.model.optimizer.learning_rate, lr)

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))

    return LearningRateFromSchedule()

