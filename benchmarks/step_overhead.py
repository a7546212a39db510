#!/usr/bin/env python
"""What the engine's step costs on the host: microseconds per step of the engine against a
hand-written loop, with a model so small (``--model linear`` on 8x8 images, batch 8) that the
step itself is almost free, so what remains is the loop's own work: per-step Python, the
metrics' kernels, the learning-rate schedule, the throughput meter, the stop check. On a GPU
that work is what the device cannot hide when the host falls behind it.

Both loops train on one batch resident on the device (``--data synthetic-resident``), in this
one process, alternately (--repeats rounds). What the engine adds is the median of each
round's difference (its two runs back to back, so a machine whose speed drifts between rounds
shifts both alike); each loop's median is printed beside it.

    python benchmarks/step_overhead.py                      # CPU, about a minute, one thread
    python benchmarks/step_overhead.py --data synthetic     # the loader-fed path instead

Prints both, their difference and the budget (--budget-us, the engine's allowance over the
hand loop per step); exit status 1 when the difference exceeds it. Not a timed test.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

# One thread: a step this small gains nothing from more, and idle OpenMP threads spinning on a
# busy machine would swamp the difference being measured. Before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import hand_loop
from bench_flags import parse, parser, synthetic_mode
from throughput import engine_rate

PROG = "python benchmarks/step_overhead.py"
BUDGET_US = 150.0  # the engine's per-step allowance over the hand loop, microseconds
# A step that is almost all host work: a linear model on 8x8 images, batch 8, one batch
# resident on the device (also benchmarks/gpu/step_probe.py's).
TINY_STEP = {"model": "linear", "image_size": 8, "per_worker_batch": 8, "data": "synthetic-resident", "amp": "none"}


def per_item_us(n: int = 20000) -> tuple[float, float]:
    """Microseconds per item of the synthetic dataset alone and through the engine's per-item
    wrapper (sampling.SeededItems, unseeded as for synthetic data): what the DataLoader
    workers pay per sample for the resumable order."""
    import time

    from guide_utils.data.loaders import SyntheticImages
    from guide_utils.engine.sampling import SeededItems

    data = SyntheticImages(n, 8, 1000, 0)
    wrapped = SeededItems(data, 0, seeded=False)
    t0 = time.perf_counter()
    for i in range(n):
        data[i]
    t1 = time.perf_counter()
    for i in range(n):
        wrapped[(0, i)]
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / n, 1e6 * (t2 - t1) / n


def main(argv=None) -> int:
    p, own = parser(PROG, __doc__, steps=400, warmup=50)
    p.set_defaults(**TINY_STEP)
    own.add_argument("--amp", choices=["none", "bf16"], default="none", help="mixed precision autocast, in both")
    own.add_argument("--repeats", type=int, default=3, help="alternating engine/hand measurements of each")
    own.add_argument("--budget-us", type=float, default=BUDGET_US,
                     help=f"allowed engine cost over the hand loop, microseconds per step (default {BUDGET_US:g})")
    args = parse(p, argv)
    resident = synthetic_mode(args) == "synthetic-resident"
    engine, hand = [], []
    for _ in range(args.repeats):
        engine.append(1e6 * args.per_worker_batch / engine_rate(args))
        hand.append(1e6 * args.per_worker_batch / hand_loop.rate(args, resident=resident))
    e, h = statistics.median(engine), statistics.median(hand)
    extra = statistics.median(a - b for a, b in zip(engine, hand))
    print(f"engine {e:8.1f} us/step   hand-written loop {h:8.1f} us/step   engine adds {extra:7.1f} us/step "
          f"(budget {args.budget_us:g} us: {'met' if extra <= args.budget_us else 'NOT met'}; "
          f"median of {args.repeats} paired rounds; "
          f"{synthetic_mode(args)}, {args.model}, batch {args.per_worker_batch}, image {args.image_size}, "
          f"device {hand_loop.device()})")
    alone, wrapped = per_item_us()
    print(f"per item in the loader workers: dataset {alone:.2f} us, through SeededItems {wrapped:.2f} us")
    print(json.dumps({"benchmark": "step_overhead", "item_us": alone, "seeded_items_us": wrapped,
                      "data": synthetic_mode(args), "model": args.model,
                      "per_worker_batch": args.per_worker_batch, "image_size": args.image_size,
                      "device": str(hand_loop.device()), "engine_us_per_step": engine, "hand_us_per_step": hand,
                      "engine_extra_us_per_step": extra, "budget_us": args.budget_us}))
    return 0 if extra <= args.budget_us else 1


if __name__ == "__main__":
    sys.exit(main())
