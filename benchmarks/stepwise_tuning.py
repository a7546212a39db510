#!/usr/bin/env python
"""Step-wise tuning on this machine, in the Summit paper's order: compute kernels, then the
input pipeline, then communication. Each step is one switch of the guide's engine, measured
against the configuration before it (alternating, --repeats rounds, median of the paired
ratios); a switch that does not win by --min-gain is not kept. Prints each step's ratio.

    python benchmarks/stepwise_tuning.py                  # about 10 minutes on 2 CPU cores
    python benchmarks/stepwise_tuning.py --record src/guide_utils/results/recorded/stepwise_tuning.jsonl
    python benchmarks/stepwise_tuning.py --walk device --repeats 1   # on a GPU: ResNet-50, minutes

``--walk device`` is the compute-kernel order on whatever device this is (fp32, TF32, bf16,
channels_last, torch.compile, CUDA graphs on a resident batch; then the loader, its workers,
uint8 input), each run in this process (guide_utils.perf.tuning.device_steps); on a CPU the
GPU-only steps are skipped with the reason printed.

The JPEG dataset, its pre-decoded shards and their staged copy are made under --data-root
(offline: crops of scikit-learn's sample photographs). Not a timed test: exit status 0
unless a run fails.
"""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("--walk", choices=["summit", "device"], default="summit",
                   help="summit: the CPU walk chapter 12 records; device: kernels then input on this device")
    p.add_argument("--skip", nargs="+", default=[], help="(device walk) leave out these steps (names as printed)")
    p.add_argument("--model", help="(device walk) model (default resnet50)")
    p.add_argument("--image-size", help="(device walk) image size (default 224)")
    p.add_argument("--per-worker-batch", help="(device walk) batch (default 128)")
    p.add_argument("--steps", help="(device walk) iterations per run (default 30)")
    args = p.parse_args(argv)
    if args.walk == "device":
        return device_walk(args)
    data = tuning.prepare_data(args.data_root)
    walk = tuning.steps(data)
    if args.only:
        walk = [s for s in walk if s.name in args.only]
    first = record.provenance(study="stepwise_tuning", repeats=args.repeats, min_gain=args.min_gain,
                              base=tuning.argv(tuning.BASE),
                              regenerate=f"python benchmarks/stepwise_tuning.py --walk summit --repeats {args.repeats} "
                                         "--record "
                                         "src/guide_utils/results/recorded/stepwise_tuning.jsonl")
    print(f"{first['hardware']}; load {first['load_avg_1min']}", flush=True)
    rows = tuning.walk(walk, repeats=args.repeats, min_gain=args.min_gain, progress=lambda s: print(s, flush=True))
    first["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    names = {path: name for name, path in data.items()}  # the datasets by name, not by this machine's paths
    for r in rows:
        r["flags"] = [names.get(f, f) for f in r["flags"]]
    return report(args, first, rows)


def report(args, first: dict, rows: list[dict]) -> int:
    print(f"{'stage':<16} {'step':<22} {'before':>8} {'after':>8} {'ratio':>6}  kept")
    for r in rows:
        print(f"{r['stage']:<16} {r['step']:<22} {r['before_images_per_second']:8.1f} "
              f"{r['after_images_per_second']:8.1f} {r['ratio']:6.3f}  {'yes' if r['kept'] else 'no'}")
    print(f"load after: {first['load_avg_1min_after']}")
    if args.record:
        record.write(args.record, first, ({"kind": "step", **r} for r in rows))
        print(f"recorded in {args.record}")
    return 0


def device_walk(args) -> int:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    walk, skipped = tuning.device_steps(device)
    skipped += [(name, "left out by --skip") for name in args.skip]
    walk = [s for s in walk if s.name not in args.skip]
    base = dict(tuning.DEVICE_BASE)
    for flag in ("model", "image_size", "per_worker_batch"):
        if getattr(args, flag):
            base["--" + flag.replace("_", "-")] = getattr(args, flag)
    if args.steps:
        base["--max-steps-per-epoch"] = args.steps
        base["--synthetic-size"] = str(int(base["--per-worker-batch"]) * (int(args.steps) + 1))
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    first = record.provenance(study="stepwise_tuning_device", device=device_name, repeats=args.repeats,
                              min_gain=args.min_gain, base=tuning.argv(base), skipped=dict(skipped))
    print(f"{first['hardware']}; device {device_name}; load {first['load_avg_1min']}", flush=True)
    for name, why in skipped:
        print(f"skipped {name}: {why}", flush=True)
    # each row as one JSON line as soon as it is measured: a walk cut short by a time limit
    # still leaves the steps it finished (the GPU check collects these lines)
    rows = tuning.walk(walk, repeats=args.repeats, min_gain=args.min_gain, base=base,
                       progress=lambda s: print(s, flush=True), measure=tuning.measure_here,
                       on_row=lambda r: print(json.dumps({"benchmark": "stepwise_device", "device": device_name,
                                                          **r}), flush=True))
    first["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    return report(args, first, rows)


if __name__ == "__main__":
    sys.exit(main())
