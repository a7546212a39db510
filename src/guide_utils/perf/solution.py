"""Time to solution: what a whole training costs, not only its steady step.

The step model (:mod:`guide_utils.perf.model`) predicts a step in the middle of an epoch.
A training pays more than ``steps x step``, and the thesis measured how much: its 32-GPU
Horovod run went at 92 % of 32 times one GPU's speed over its first 200 batches, yet its
90 epochs took 6 h 36 min against one GPU's 6 days 4 h 16 min, a 22.5x speedup, 70 % of
32. The difference is time the step never sees, and it does not shrink as GPUs are added,
so it weighs more the more GPUs there are. Each epoch of ``E`` pays:

* its **steps**: ``ceil(N / (n b))`` of them (a partial last batch is a whole step), the
  first one of which is slow: the data loader's workers start and fill their queues, so
  the **first batch** takes ``first_batch_s`` instead of one step (the thesis's logs show
  9.7 to 22 s where a step takes 0.6 s, its Figures 12 and 13);
* a **validation pass**: ``V`` images forward only, about three times one training step's
  rate per image (the forward pass is about a third of forward + backward); split over the
  workers when the script shards the validation set (Horovod's example), on every worker
  whole when it does not (assumed for the PyTorch examples script the thesis ran without
  Horovod: see :mod:`guide_utils.perf.thesis_runs`);
* a **checkpoint**: weights and momentum, 8 bytes per parameter, written by one rank;
* the **epoch boundary**: whatever else an epoch costs once (the validation loader's own
  start, the ranks' synchronisation, logging). The thesis cannot tell this term apart from
  the job's **start-up** (staging the dataset on each node, imports, the launcher), since
  all of its runs are 90 epochs long: the calibration puts both here, per epoch.

Then ``wall = startup + E x (steps + first batch + validation + checkpoint + boundary)``,
GPU-hours ``= n x wall``, and the **time-to-solution efficiency** is one GPU's wall time
over ``n`` times this one's: what the allocation was worth, against the step's
**throughput efficiency** (``t_c / step``), which is what a benchmark of a few hundred
batches measures.

>>> from guide_utils.perf.model import Network, Workload, predict
>>> p = predict(Workload(25_557_032, 128, 207.79), Network.of("56Gbit/s", "5us"), 32)
>>> t = time_to_solution(p, Overheads(first_batch_s=10, epoch_s=30), epochs=90, images=1_281_167)
>>> t["steps_per_epoch"], round(t["wall_hours"], 2), round(t["first_batch_hours"], 3)
(313, 6.1, 0.234)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import GuideError
from .model import Prediction

IMAGENET_VALIDATION_IMAGES = 50_000  # ILSVRC 2012 validation set (thesis section 3)
FORWARD_SPEEDUP = 3.0  # forward alone against forward + backward (backward ~ 2/3 of a step)
CHECKPOINT_BYTES_PER_PARAM = 8  # fp32 weights + SGD momentum
CHECKPOINT_WRITE = 1e9  # bytes/s one rank writes to a parallel file system (an assumption)


@dataclass(frozen=True)
class Overheads:
    """The terms of a training that are not its steady steps (seconds; see the module doc)."""

    first_batch_s: float = 0.0  # the whole first step of each epoch (0: as fast as the others)
    epoch_s: float = 0.0  # per epoch: the boundary, and start-up spread over the epochs
    startup_s: float = 0.0  # once per job: staging, imports, the launcher
    validation_images: int = IMAGENET_VALIDATION_IMAGES
    validation_sharded: bool = True  # the validation set split over the workers
    checkpoint: bool = True

    def __post_init__(self):
        for name, flag in (("first_batch_s", "--first-batch-s"), ("epoch_s", "--epoch-overhead-s"),
                           ("startup_s", "--startup-min")):
            if not getattr(self, name) >= 0:
                raise GuideError(f"{flag} must not be negative, got {getattr(self, name)!r}")
        if not isinstance(self.validation_images, int) or self.validation_images < 0:
            raise GuideError(f"validation images must be 0 or a positive integer, got {self.validation_images!r}")


NONE = Overheads(validation_images=0, checkpoint=False)  # the step model alone


def validation_s(p: Prediction, overheads: Overheads) -> float:
    """One validation pass: forward only at ``FORWARD_SPEEDUP`` x one worker's training rate,
    over ``1/n`` of the images per worker when sharded, all of them otherwise."""
    per_worker = overheads.validation_images / (p.workers if overheads.validation_sharded else 1)
    return per_worker / (FORWARD_SPEEDUP * p.per_worker_batch / p.compute_s)


def checkpoint_s(params: int, overheads: Overheads) -> float:
    """One rank writing weights and momentum at ``CHECKPOINT_WRITE`` bytes/s."""
    return params * CHECKPOINT_BYTES_PER_PARAM / CHECKPOINT_WRITE if overheads.checkpoint else 0.0


def time_to_solution(p: Prediction, overheads: Overheads, *, epochs: int, images: int,
                     params: int = 25_557_032) -> dict[str, float]:
    """Wall-clock hours of ``epochs`` passes over ``images`` with ``overheads``, term by term
    (``*_hours``: each term over the whole training), and GPU-hours (``workers x wall``)."""
    if not isinstance(epochs, int) or epochs <= 0 or not isinstance(images, int) or images <= 0:
        raise GuideError(f"epochs and images must be positive integers, got {epochs!r} and {images!r}")
    steps = math.ceil(images / p.global_batch)
    first_extra = max(0.0, overheads.first_batch_s - p.step_s) if overheads.first_batch_s else 0.0
    terms = {"steps_hours": steps * p.step_s, "first_batch_hours": first_extra,
             "validation_hours": validation_s(p, overheads), "checkpoint_hours": checkpoint_s(params, overheads),
             "epoch_hours": overheads.epoch_s}
    out = {k: epochs * v / 3600 for k, v in terms.items()}
    out["startup_hours"] = overheads.startup_s / 3600
    wall = sum(out.values())
    return {"steps_per_epoch": steps, **out, "wall_hours": wall, "gpu_hours": wall * p.workers}
