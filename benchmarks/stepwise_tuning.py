#!/usr/bin/env python
"""Step-wise tuning on this machine, in the Summit paper's order: compute kernels, then the
input pipeline, then communication. Each step is one switch of the guide's engine, measured
against the configuration before it (alternating, --repeats rounds, median of the paired
ratios); a switch that does not win by --min-gain is not kept. Prints each step's ratio.

    python benchmarks/stepwise_tuning.py                  # about 10 minutes on 2 CPU cores
    python benchmarks/stepwise_tuning.py --record src/guide_utils/results/recorded/stepwise_tuning.jsonl

The JPEG dataset, its pre-decoded shards and their staged copy are made under --data-root
(offline: crops of scikit-learn's sample photographs). Not a timed test: exit status 0
unless a run fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile

from guide_utils.perf import record, tuning


def main(argv: list[str] | None = None) -> int:
    # A SIGTERM (scancel, timeout) ends the workers this script started, not only the script.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--min-gain", type=float, default=0.02, help="keep a switch that wins by more (default 0.02)")
    p.add_argument("--data-root", default=os.path.join(tempfile.gettempdir(), "guide-tuning-data"))
    p.add_argument("--only", nargs="+", help="run only these steps (names as printed), each against the base")
    p.add_argument("--record", help="write the results, provenance first, to this file")
    args = p.parse_args(argv)
    data = tuning.prepare_data(args.data_root)
    walk = tuning.steps(data)
    if args.only:
        walk = [s for s in walk if s.name in args.only]
    first = record.provenance(study="stepwise_tuning", repeats=args.repeats, min_gain=args.min_gain,
                              base=tuning.argv(tuning.BASE),
                              regenerate=f"python benchmarks/stepwise_tuning.py --repeats {args.repeats} --record "
                                         "src/guide_utils/results/recorded/stepwise_tuning.jsonl")
    print(f"{first['hardware']}; load {first['load_avg_1min']}", flush=True)
    rows = tuning.walk(walk, repeats=args.repeats, min_gain=args.min_gain, progress=lambda s: print(s, flush=True))
    first["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    names = {path: name for name, path in data.items()}  # the datasets by name, not by this machine's paths
    for r in rows:
        r["flags"] = [names.get(f, f) for f in r["flags"]]
    print(f"{'stage':<16} {'step':<22} {'before':>8} {'after':>8} {'ratio':>6}  kept")
    for r in rows:
        print(f"{r['stage']:<16} {r['step']:<22} {r['before_images_per_second']:8.1f} "
              f"{r['after_images_per_second']:8.1f} {r['ratio']:6.3f}  {'yes' if r['kept'] else 'no'}")
    print(f"load after: {first['load_avg_1min_after']}")
    if args.record:
        record.write(args.record, first, ({"kind": "step", **r} for r in rows))
        print(f"recorded in {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
