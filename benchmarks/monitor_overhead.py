#!/usr/bin/env python
"""What does ``--monitor`` cost? The same training with and without the utilisation sampler,
alternately in this one process, several times; prints both images/s (median and range) and
the ratio round by round (median and range of the paired rounds, ``perf.spread.paired``).

    python benchmarks/monitor_overhead.py                        # CPU, about a minute
    python benchmarks/monitor_overhead.py --model resnet50 --image-size 224 \\
        --per-worker-batch 128 --loader-workers 8 --steps 200     # one GPU

Exit status 1 if monitoring costs more than --max-loss (default 1 %) in every round (the
target missed), 0 when it costs less in every round (met) or the rounds straddle it
(undecided: the spread is larger than the effect; repeat with more --repeats). Not a timed
test: run it on the machine you care about; on a shared or busy machine repeat it. Every flag of
``python -m guide_utils.train`` applies to both runs.
"""

from __future__ import annotations

import os
import sys
import tempfile

from bench_flags import parse, parser, timed_config

from guide_utils.perf import spread

PROG = "python benchmarks/monitor_overhead.py"


def rate(args, monitor: float | None) -> float:
    from guide_utils.engine import train

    with tempfile.TemporaryDirectory() as results:
        return train(timed_config(args, results_dir=results, monitor=monitor)).epochs[0]["images_per_second"]


def main(argv: list[str] | None = None) -> int:
    p, own = parser(PROG, __doc__, steps=60, warmup=5)
    own.add_argument("--interval", type=float, default=1.0, help="seconds between samples (the --monitor default)")
    own.add_argument("--repeats", type=int, default=5)
    own.add_argument("--max-loss", type=float, default=0.01)
    own.add_argument("--record", help="write the result, provenance first, to this file (JSON lines)")
    args = parse(p, argv)
    load_before = os.getloadavg()[0]
    rate(args, None)  # warm up: data, allocator, thread pools
    off, on = [], []
    for i in range(args.repeats):  # alternate, so drifts in the machine's speed hit both
        for monitor, rates in ((None, off), (args.interval, on))[:: 1 if i % 2 == 0 else -1]:
            rates.append(rate(args, monitor))
    ratio = spread.paired(on, off)  # round by round: a drift of the machine hits both members of a pair
    met = spread.verdict(ratio, 1 - args.max_loss)
    print(f"{args.model}, batch {args.per_worker_batch}, {args.steps} steps x {args.repeats} repeats each")
    print(f"without --monitor: {spread.rounds(off):.1f} img/s")
    print(f"with --monitor {args.interval:g}: {spread.rounds(on):.1f} img/s")
    print(f"ratio with/without, paired by round: {ratio:.3f}; at most {100 * args.max_loss:g} % lost: {met}; "
          f"load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    if args.record:
        from guide_utils.perf import record

        first = record.provenance(study="monitor_overhead", repeats=args.repeats, load_avg_1min=round(load_before, 2),
                                  load_avg_1min_after=round(os.getloadavg()[0], 2),
                                  regenerate="python benchmarks/monitor_overhead.py --record "
                                             "src/guide_utils/results/recorded/monitor_overhead.jsonl")
        result = {"kind": "result", "model": args.model, "per_worker_batch": args.per_worker_batch, "steps": args.steps,
                  "interval_s": args.interval, "without": off, "with": on, "ratio": ratio.median,
                  "ratio_low": ratio.low, "ratio_high": ratio.high}
        record.write(args.record, first, [result])
    return 1 if met == "missed" else 0


if __name__ == "__main__":
    sys.exit(main())
