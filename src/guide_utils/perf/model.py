"""A model of one data-parallel training step, to predict scaling before paying for it.

One step of synchronous data parallelism on n workers is the single worker's step (forward
and backward at its per-worker batch, from its measured throughput) plus the part of the
gradient allreduce that the backward pass cannot hide:

* compute: ``t_c = per_worker_batch / images_per_second`` (one worker alone);
* communication, a ring allreduce of the gradients (the alpha-beta model, as nccl-tests'
  bus bandwidth defines it): ``t_ar = 2(n-1) alpha + 2(n-1)/n x M / B``, with
  ``M = parameters x bytes per element`` (4 for fp32, 2 with fp16 compression), ``B`` the
  bandwidth each worker's link gives the ring and ``alpha`` the latency of one ring step;
* overlap: gradients are sent while the backward pass (``backward_fraction`` of ``t_c``,
  about two thirds for a CNN) is still computing earlier layers; ``overlap`` is the share of
  that backward time communication can run under (0: none, as on a CPU whose cores do
  both; 1: all of it, the ideal of bucketed NCCL on GPUs). The exposed communication is
  ``t_ar - min(t_ar, overlap x backward_fraction x t_c)``.

Then ``step = t_c + exposed``, ``throughput = n x batch / step``, ``efficiency = t_c / step``
(against n independent copies of the single worker), and an E-epoch training of N images
takes ``E N / throughput`` hours of wall time and n times that in GPU-hours.

The model leaves out on purpose what it cannot know: stragglers and jitter, the input
pipeline, the framework's own coordination (Horovod's negotiation cycle), contention of
communication and compute for memory bandwidth or cores. Chapter 11 compares it with
measurements and published numbers and says where these matter.

>>> w = Workload(params=25_557_032, per_worker_batch=128, images_per_second=207.79)
>>> p = predict(w, Network.of("10Gbit/s", "50us"), workers=8)
>>> round(p.allreduce_s, 6), round(p.step_s, 4), round(p.efficiency, 4)
(0.143819, 0.7598, 0.8107)
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from ..core.errors import GuideError
from .units import parse_bandwidth

# Parameters of the models the guide trains or cites (torchvision's counts).
PARAMETERS = {"resnet50": 25_557_032, "resnet18": 11_689_512, "resnet101": 44_549_160,
              "vgg16": 138_357_544, "inception_v3": 27_161_264, "mobilenet_v2": 3_504_872, "small_resnet": 78_042}


def gflops(model: str) -> float:
    """Forward GFLOPs of one 224 px image, as torchvision's weight metadata states them.

    >>> gflops("resnet50"), gflops("vgg16")
    (4.089, 15.47)
    """
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(model)
    except (ValueError, KeyError):
        raise GuideError(f"torchvision has no FLOP count for {model!r}") from None
    return float(next(iter(weights)).meta["_ops"])


def parse_latency(text: str | float) -> float:
    """Seconds from ``"5us"``, ``"1.5 ms"``, ``"0.00002s"``; a bare number is refused.

    >>> parse_latency("50us"), parse_latency("1.5ms")
    (5e-05, 0.0015)
    """
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*", str(text))
    if not m:
        raise GuideError(f"latency {text!r} has no unit; write e.g. 2us (InfiniBand), 30us (TCP), 1ms")
    value = float(m.group(1)) / {"ns": 1e9, "us": 1e6, "µs": 1e6, "ms": 1e3, "s": 1.0}[m.group(2)]
    if value < 0:
        raise GuideError(f"latency must not be negative, got {text!r}")
    return value


@dataclass(frozen=True)
class Network:
    bandwidth: float  # bytes per second each worker's link gives the ring (its bus bandwidth)
    latency: float  # seconds per ring step (alpha)

    @classmethod
    def of(cls, bandwidth: str | float, latency: str | float = "5us") -> "Network":
        """From strings with units (``"25Gbit/s"``, ``"12GB/s"``; ``"5us"``) or bytes/s and seconds."""
        b = parse_bandwidth(bandwidth) if isinstance(bandwidth, str) else float(bandwidth)
        a = parse_latency(latency) if isinstance(latency, str) else float(latency)
        if not b > 0:
            raise GuideError(f"bandwidth must be positive, got {bandwidth!r}")
        if a < 0:
            raise GuideError(f"latency must not be negative, got {latency!r}")
        return cls(b, a)


@dataclass(frozen=True)
class Workload:
    params: int
    per_worker_batch: int
    images_per_second: float  # one worker alone at this per-worker batch
    bytes_per_element: int = 4  # 2 with fp16 gradient compression
    backward_fraction: float = 2 / 3
    overlap: float = 0.0

    def __post_init__(self):
        if not isinstance(self.params, int) or self.params <= 0:
            raise GuideError(f"the model's parameter count must be a positive integer, got {self.params!r}")
        if not isinstance(self.per_worker_batch, int) or self.per_worker_batch <= 0:
            raise GuideError(f"the per-worker batch must be a positive integer, got {self.per_worker_batch!r}")
        if not self.images_per_second > 0:
            raise GuideError(f"the single-worker throughput must be positive images/s, got {self.images_per_second!r}")
        if self.bytes_per_element not in (1, 2, 4, 8):
            raise GuideError(f"bytes per gradient element must be 1, 2, 4 or 8, got {self.bytes_per_element!r}")
        if not 0 <= self.overlap <= 1 or not 0 < self.backward_fraction <= 1:
            raise GuideError("overlap must be in [0, 1] and the backward fraction in (0, 1]")

    @property
    def gradient_bytes(self) -> int:
        return self.params * self.bytes_per_element

    @property
    def compute_s(self) -> float:
        return self.per_worker_batch / self.images_per_second


def ring_allreduce_s(size_bytes: float, workers: int, network: Network) -> float:
    """``2(n-1) alpha + 2(n-1)/n x size / B``; zero for one worker (nothing to reduce).

    >>> round(ring_allreduce_s(102_228_128, 2, Network.of("1Gbit/s", "0us")), 4)
    0.8178
    """
    if not isinstance(workers, int) or workers < 1:
        raise GuideError(f"workers must be a positive integer, got {workers!r}")
    if workers == 1:
        return 0.0
    return 2 * (workers - 1) * network.latency + 2 * (workers - 1) / workers * size_bytes / network.bandwidth


@dataclass(frozen=True)
class Prediction:
    workers: int
    per_worker_batch: int
    global_batch: int
    compute_s: float
    allreduce_s: float
    exposed_s: float
    step_s: float
    images_per_second: float
    efficiency: float

    def training(self, epochs: int, images: int) -> dict[str, float]:
        """Wall-clock hours and GPU-hours for ``epochs`` passes over ``images`` images."""
        if not isinstance(epochs, int) or epochs <= 0 or not isinstance(images, int) or images <= 0:
            raise GuideError(f"epochs and images must be positive integers, got {epochs!r} and {images!r}")
        wall = epochs * images / self.images_per_second / 3600
        return {"wall_hours": wall, "gpu_hours": wall * self.workers}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(workload: Workload, network: Network, workers: int) -> Prediction:
    """One step of ``workload`` on ``workers`` workers connected by ``network``."""
    t_c = workload.compute_s
    t_ar = ring_allreduce_s(workload.gradient_bytes, workers, network)
    hidden = min(t_ar, workload.overlap * workload.backward_fraction * t_c)
    step = t_c + t_ar - hidden
    return Prediction(workers, workload.per_worker_batch, workers * workload.per_worker_batch, t_c, t_ar,
                      t_ar - hidden, step, workers * workload.per_worker_batch / step, t_c / step)


def efficiency_curve(workload: Workload, network: Network, workers: list[int]):
    """Predictions for each worker count, as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([predict(workload, network, n).as_dict() for n in workers])


def calibrate_network(rows: list[dict[str, Any]], runtime: str, *, size_bytes: float) -> Network:
    """A :class:`Network` from a comms benchmark's sweep: ``alpha`` from the smallest message
    (``t = 2(n-1) alpha`` when the bytes are negligible), ``B`` from the allreduce time at
    ``size_bytes`` (the model's gradients), interpolated log-log between the two measured
    sizes around it: ``B = 2(n-1)/n x size / (t - 2(n-1) alpha)``."""
    import math

    sweep = sorted((r for r in rows if r.get("kind") == "allreduce" and r.get("runtime") == runtime
                    and r.get("compression", "none") == "none"), key=lambda r: r["bytes"])
    if not sweep:
        raise GuideError(f"no allreduce sweep of runtime {runtime!r} in these results; run python -m guide_utils "
                         f"comms --runtime {runtime}")
    n = sweep[0]["workers"]
    if n < 2:
        raise GuideError("a one-worker benchmark has no bandwidth to calibrate from; run it with 2 or more workers")
    alpha = sweep[0]["time_s"] / (2 * (n - 1))
    below = [r for r in sweep if r["bytes"] <= size_bytes] or sweep[:1]
    above = [r for r in sweep if r["bytes"] >= size_bytes] or sweep[-1:]
    lo, hi = below[-1], above[0]
    if lo["bytes"] == hi["bytes"]:
        t = lo["time_s"] * size_bytes / lo["bytes"]  # outside the sweep: proportional to the nearest
    else:
        w = math.log(size_bytes / lo["bytes"]) / math.log(hi["bytes"] / lo["bytes"])
        t = math.exp((1 - w) * math.log(lo["time_s"]) + w * math.log(hi["time_s"]))
    latency_part = min(2 * (n - 1) * alpha, 0.5 * t)
    return Network(2 * (n - 1) / n * size_bytes / (t - latency_part), alpha)
