"""Images per second: the thesis's formula and a meter for training loops.

The thesis computed throughput from the PyTorch-examples log as
``per-GPU batch x GPUs / average batch time`` (Section 5.1), reading the running average
printed at batch 199, so the slow first batches were averaged in. The meter below drops a
number of warm-up iterations instead (cuDNN autotuning, allocator growth, loader start-up).

>>> round(images_per_second(128, 1, 0.633), 2)
202.21
"""

from __future__ import annotations

import time
from typing import Callable


def images_per_second(per_worker_batch: int, workers: int, mean_batch_time: float) -> float:
    """``per_worker_batch * workers / mean_batch_time`` (thesis, Section 5.1)."""
    if per_worker_batch <= 0:
        raise ValueError(f"per_worker_batch must be positive, got {per_worker_batch!r}")
    if workers <= 0:
        raise ValueError(f"workers must be positive, got {workers!r}")
    if not mean_batch_time > 0:
        raise ValueError(f"mean_batch_time must be positive, got {mean_batch_time!r}")
    return per_worker_batch * workers / mean_batch_time


class ThroughputMeter:
    """Times iterations; the first ``warmup_iters`` are left out of every rate.

    Call :meth:`step` once before the first iteration (it starts the clock) and once at
    the end of each iteration. Optionally call :meth:`mark_data_ready` when the batch has
    arrived, to split time into waiting for data and computing.

    >>> ticks = iter([0.0, 1.0, 1.5, 2.0, 2.5])
    >>> m = ThroughputMeter(64, workers=2, warmup_iters=1, clock=lambda: next(ticks))
    >>> for _ in range(5): m.step()
    >>> m.measured_iters, m.mean_batch_time, m.images_per_second()
    (3, 0.5, 256.0)
    """

    def __init__(self, per_worker_batch: int, workers: int = 1, warmup_iters: int = 10,
                 clock: Callable[[], float] = time.perf_counter):
        if warmup_iters < 0:
            raise ValueError(f"warmup_iters must be 0 or more, got {warmup_iters!r}")
        images_per_second(per_worker_batch, workers, 1.0)  # validates both
        self.per_worker_batch, self.workers, self.warmup_iters = per_worker_batch, workers, warmup_iters
        self.clock = clock
        self.iters = 0  # completed iterations
        self._last: float | None = None
        self._ready: float | None = None
        self._measured_time = 0.0
        self._data_time = 0.0
        self._data_marks = 0

    def mark_data_ready(self) -> None:
        self._ready = self.clock()

    def step(self) -> None:
        now = self.clock()
        if self._last is not None:
            self.iters += 1
            if self.iters > self.warmup_iters:
                self._measured_time += now - self._last
                if self._ready is not None:
                    self._data_time += self._ready - self._last
                    self._data_marks += 1
        self._last, self._ready = now, None

    @property
    def measured_iters(self) -> int:
        return max(0, self.iters - self.warmup_iters)

    @property
    def mean_batch_time(self) -> float:
        if self.measured_iters == 0:
            raise RuntimeError(f"no iterations measured after {self.warmup_iters} warm-up iterations; "
                               "run more iterations or lower warmup_iters")
        return self._measured_time / self.measured_iters

    def images_per_second(self) -> float:
        """All workers together."""
        return images_per_second(self.per_worker_batch, self.workers, self.mean_batch_time)

    def images_per_second_per_worker(self) -> float:
        return self.images_per_second() / self.workers

    def summary(self) -> dict:
        out = {"images_per_second": self.images_per_second(),
               "images_per_second_per_worker": self.images_per_second_per_worker(),
               "mean_batch_time": self.mean_batch_time, "measured_iters": self.measured_iters,
               "warmup_iters": self.warmup_iters}
        if self._data_marks:
            out["data_fraction"] = self._data_time / self._measured_time if self._measured_time else 0.0
        return out
