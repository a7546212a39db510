#!/usr/bin/env python
"""Is the engine as fast as the simplest loop that could train the same thing?

Runs the guide's engine and a minimal hand-written loop (same model, batch, data, optimizer
and input path) alternately in this one process, and prints both images/s and their ratio.
The engine adds a sampler, metrics kept on the device, a per-iteration learning-rate
schedule, a throughput meter and stop checks; the ratio shows what they cost.

``--data`` picks what both loops are fed: ``synthetic-loader`` (``synthetic``, the default:
random images through the DataLoader, uint8 normalised on the device on a GPU) against a
hand loop over the same loader settings, or ``synthetic-resident`` (one batch on the device,
reused) against the hand-written resident loop. ``--resident-reference`` also measures the
resident hand loop (what the device does when nothing feeds it) and prints the engine's
ratio to it.

    python benchmarks/throughput.py                                 # CPU, seconds
    python benchmarks/throughput.py --model resnet50 --image-size 224 --per-worker-batch 128 \\
        --amp bf16 --channels-last --steps 60 --warmup 15 --resident-reference     # one GPU

Exit status 1 if the ratio to the hand loop falls below --min-ratio (default 0.97), or the
ratio to the resident reference below --min-resident-ratio (when given). Not a timed test:
run it on the machine you care about. Every flag of ``python -m guide_utils.train`` applies
to the engine's run (the hand-written loop follows the model, batch, image size, loader
workers, --input-dtype, --amp and --channels-last).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile

import hand_loop
from bench_flags import parse, parser, synthetic_mode, timed_config

PROG = "python benchmarks/throughput.py"


def engine_rate(args) -> float:
    from guide_utils.engine import train

    if getattr(args, "records", None):  # keep the run records (they name the device and the settings)
        return train(timed_config(args, results_dir=args.records)).epochs[0]["images_per_second"]
    with tempfile.TemporaryDirectory() as results:
        return train(timed_config(args, results_dir=results)).epochs[0]["images_per_second"]


def main(argv=None) -> int:
    p, own = parser(PROG, __doc__, steps=60, warmup=10)
    # The hand-written loop has no loss scaler, so fp16 would not be the same training.
    own.add_argument("--amp", choices=["none", "bf16"], default="none", help="mixed precision autocast, in both")
    own.add_argument("--repeats", type=int, default=3, help="alternating engine/hand measurements of each")
    own.add_argument("--min-ratio", type=float, default=0.97)
    own.add_argument("--resident-reference", action="store_true",
                     help="also time the hand-written loop on a resident batch and print the engine's ratio to it")
    own.add_argument("--min-resident-ratio", type=float, default=None)
    own.add_argument("--records", metavar="DIR", help="keep the engine's run records in DIR (default: discarded)")
    args = parse(p, argv)
    resident = synthetic_mode(args) == "synthetic-resident"

    rates: dict[str, list[float]] = {"engine": [], "hand": [], "resident": []}
    for _ in range(args.repeats):  # alternate, so drift in machine load hits all alike
        rates["engine"].append(engine_rate(args))
        rates["hand"].append(hand_loop.rate(args, resident=resident))
        if args.resident_reference and not resident:
            rates["resident"].append(hand_loop.rate(args, resident=True))
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    ratio = med["engine"] / med["hand"]
    what = f"{synthetic_mode(args)}, {args.model}, batch {args.per_worker_batch}, image {args.image_size}, " \
        f"amp {args.amp}{', channels_last' if args.channels_last else ''}"
    print(f"engine {med['engine']:10.1f} img/s   hand-written loop {med['hand']:10.1f} img/s   ratio {ratio:.3f} "
          f"(median of {args.repeats}; {what})")
    out = {"benchmark": "engine_vs_hand_loop", "data": synthetic_mode(args), "model": args.model,
           "per_worker_batch": args.per_worker_batch, "image_size": args.image_size, "amp": args.amp,
           "channels_last": bool(args.channels_last), "input_dtype": args.input_dtype or "auto",
           "loader_workers": args.loader_workers, "device": str(hand_loop.device()),
           "engine_images_per_second": rates["engine"], "hand_images_per_second": rates["hand"], "ratio": ratio}
    failed = ratio < args.min_ratio
    if "resident" in med:
        out.update(resident_images_per_second=rates["resident"], ratio_to_resident=med["engine"] / med["resident"],
                   hand_ratio_to_resident=med["hand"] / med["resident"])
        print(f"resident reference {med['resident']:10.1f} img/s   engine / resident {out['ratio_to_resident']:.3f}"
              f"   hand loop / resident {out['hand_ratio_to_resident']:.3f}")
        failed |= args.min_resident_ratio is not None and out["ratio_to_resident"] < args.min_resident_ratio
    print(json.dumps(out))
    if ratio < args.min_ratio:
        print(f"FAIL: the engine is slower than the hand-written loop (ratio {ratio:.3f} < {args.min_ratio})")
    if failed and ratio >= args.min_ratio:
        print(f"FAIL: the engine is below {args.min_resident_ratio} of the resident reference")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
