#!/usr/bin/env python
"""Record what ``benchmarks/gpu/run_h100.sh`` measured: its ``OUT`` directory (env.txt,
results.jsonl) becomes the next free ``src/guide_utils/results/recorded/gpu_h100_after*.jsonl``
(``gpu_h100_after.jsonl``, then ``gpu_h100_after_2.jsonl``, ...), which chapters 1 and 12 read
(guide_utils.perf.gpu_records.afters).

    python benchmarks/gpu/record_h100.py OUT --commit abc1234 [--dest FILE]

--commit is the commit the GPU machine ran (its copy may not be a git checkout). Refuses to
overwrite an existing record unless --replace.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from guide_utils.core.paths import packaged
from guide_utils.perf import gpu_records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the directory run_h100.sh wrote (its $OUT)")
    p.add_argument("--commit", required=True, help="the commit that ran on the GPU")
    p.add_argument("--dest", default=str(packaged("results", "recorded", gpu_records.next_after_name())))
    p.add_argument("--replace", action="store_true", help="replace an existing record")
    args = p.parse_args(argv)
    if Path(args.dest).exists() and not args.replace:
        print(f"{args.dest} exists; pass --replace to overwrite it", file=sys.stderr)
        return 2
    try:
        print(f"recorded in {gpu_records.record_check(args.out, args.dest, commit=args.commit)}")
    except (OSError, ValueError) as e:
        print(f"record_h100: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
