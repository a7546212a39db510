#!/usr/bin/env python
"""Two workers on this machine: how close does each way of training them come to two workers
that do not communicate at all?

Every setup trains ResNet-18 on synthetic 64 px images (16 per worker, 40 steps, 1 thread per
worker) through the guide's engine; setups run in rounds, alternating, and each is compared
with the two-independent-workers limit of its own round (the same per-worker batch, started
at the same time, no communication). Prints a table and one JSON line; ``--record`` writes
the results to a file with the date, machine, load, commit and versions in its first line.

    python benchmarks/two_worker_scaling.py                          # the default and the recommended
    python benchmarks/two_worker_scaling.py --setups all --repeats 3 # every setup (about 15 minutes)
    python benchmarks/two_worker_scaling.py --record src/guide_utils/results/recorded/two_workers.jsonl

Exit status 1 if the guide's recommended configuration stays below --min-ratio (0.85) of its
limit. Not a timed test: run it on a machine nobody else is using, and repeat it if the
printed load was high.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from guide_utils.perf import twoworkers


def main(argv: list[str] | None = None) -> int:
    # A SIGTERM (scancel, timeout) ends the workers this script started, not only the script.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", nargs="+", default=["default"],
                   help="names (see --list), 'default' (the defaults and the recommended), or 'all'")
    p.add_argument("--list", action="store_true", help="list the setups and exit")
    p.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--steps", type=int, default=twoworkers.STEPS)
    p.add_argument("--min-ratio", type=float, default=0.85)
    p.add_argument("--record", help="write the results (JSON lines, provenance first) to this file")
    args = p.parse_args(argv)
    if args.list:
        for s in twoworkers.SETUPS.values():
            print(f"{s.name:<28} {s.describe()}  {s.note}")
        return 0
    names = twoworkers.choose(args.setups)
    print(f"load before: {os.getloadavg()[0]:.2f}; setups: {', '.join(names)}", flush=True)
    result = twoworkers.measure(names, repeats=args.repeats, steps=args.steps,
                                progress=lambda line: print(line, flush=True), asked=" ".join(args.setups))
    print(twoworkers.format_result(result))
    print(json.dumps({"benchmark": "two_worker_scaling", **result["meta"],
                      "ratios": {r["setup"]: round(r["ratio_to_limit"], 3) for r in result["rows"]}}))
    if args.record:
        twoworkers.write_record(result, args.record)
        print(f"recorded in {args.record}")
    rec = [r for r in result["rows"] if r["setup"] == twoworkers.RECOMMENDED]
    if rec and rec[0]["ratio_to_limit"] < args.min_ratio:
        print(f"FAIL: the recommended configuration reached {rec[0]['ratio_to_limit']:.3f} of its limit "
              f"(< {args.min_ratio})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
