#!/usr/bin/env python
"""What does ``--monitor`` cost? The same training with and without the utilisation sampler,
alternately in this one process, several times; prints both images/s (median) and the ratio.

    python benchmarks/monitor_overhead.py                        # CPU, about a minute
    python benchmarks/monitor_overhead.py --model resnet50 --image-size 224 \\
        --per-worker-batch 128 --loader-workers 8 --steps 200     # one GPU

Exit status 1 if monitoring costs more than --max-loss (default 1 %). Not a timed test: run
it on the machine you care about; on a shared or busy machine repeat it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile


def rate(args, monitor: float | None) -> float:
    from guide_utils.core.config import make_config
    from guide_utils.engine import train

    with tempfile.TemporaryDirectory() as results:
        cfg = make_config("full", model=args.model, data="synthetic", image_size=args.image_size,
                          synthetic_size=args.per_worker_batch * (args.steps + 1), epochs=1,
                          per_worker_batch=args.per_worker_batch, loader_workers=args.loader_workers,
                          max_steps_per_epoch=args.steps, throughput_warmup_iters=args.warmup,
                          results_dir=results, progress=False, monitor=monitor)
        return train(cfg).epochs[0]["images_per_second"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small_resnet")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--per-worker-batch", type=int, default=64)
    p.add_argument("--loader-workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (the --monitor default)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-loss", type=float, default=0.01)
    p.add_argument("--record", help="write the result, provenance first, to this file (JSON lines)")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    rate(args, None)  # warm up: data, allocator, thread pools
    off, on = [], []
    for i in range(args.repeats):  # alternate, so drifts in the machine's speed hit both
        for monitor, rates in ((None, off), (args.interval, on))[:: 1 if i % 2 == 0 else -1]:
            rates.append(rate(args, monitor))
    off_rate, on_rate = statistics.median(off), statistics.median(on)
    ratio = on_rate / off_rate
    print(f"{args.model}, batch {args.per_worker_batch}, {args.steps} steps x {args.repeats} repeats each")
    print(f"without --monitor: {off_rate:8.1f} img/s (median; runs {', '.join(f'{r:.0f}' for r in off)})")
    print(f"with --monitor {args.interval:g}: {on_rate:8.1f} img/s (median; runs {', '.join(f'{r:.0f}' for r in on)})")
    print(f"ratio with/without: {ratio:.3f} ({100 * (1 - ratio):+.1f} % throughput lost); "
          f"load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    if args.record:
        from guide_utils.perf import record

        first = record.provenance(study="monitor_overhead", repeats=args.repeats, load_avg_1min=round(load_before, 2),
                                  load_avg_1min_after=round(os.getloadavg()[0], 2),
                                  regenerate="python benchmarks/monitor_overhead.py --record "
                                             "src/guide_utils/results/recorded/monitor_overhead.jsonl")
        record.write(args.record, first, [{"kind": "result", "model": args.model, "per_worker_batch": args.per_worker_batch,
                                           "steps": args.steps, "interval_s": args.interval, "without": off,
                                           "with": on, "ratio": ratio}])
    return 0 if ratio >= 1 - args.max_loss else 1


if __name__ == "__main__":
    sys.exit(main())
