#!/usr/bin/env python
"""Is the engine as fast as the simplest loop that could train the same thing?

Runs the guide's engine and a minimal hand-written loop (same model, batch, data, optimizer
and DataLoader settings) alternately in this one process, and prints both images/s and
their ratio. The engine adds a sampler, metrics kept on the device, a per-iteration
learning-rate schedule, a throughput meter and stop checks; the ratio shows what they cost.

    python benchmarks/throughput.py                                 # CPU, seconds
    python benchmarks/throughput.py --model resnet50 --image-size 224 --per-worker-batch 128 \\
        --loader-workers 8 --steps 100                              # one GPU

Exit status 1 if the ratio falls below --min-ratio (default 0.97). Not a timed test: run
it on the machine you care about. Every flag of ``python -m guide_utils.train`` applies to
the engine's run (the hand-written loop follows the model, batch, image size, loader workers,
--amp and --channels-last).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time

from bench_flags import parse, parser, timed_config

PROG = "python benchmarks/throughput.py"


def engine_rate(args) -> float:
    from guide_utils.engine import train

    with tempfile.TemporaryDirectory() as results:
        return train(timed_config(args, results_dir=results)).epochs[0]["images_per_second"]


def hand_rate(args) -> float:
    import torch
    from torch.utils.data import DataLoader

    from guide_utils.data.loaders import build_data
    from guide_utils.engine.models import build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    bundle = build_data("synthetic", image_size=args.image_size,
                        synthetic_size=args.per_worker_batch * (args.steps + 1), seed=0)
    model = build_model(args.model, num_classes=bundle.num_classes, input_shape=bundle.input_shape).to(device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loader = DataLoader(bundle.train, batch_size=args.per_worker_batch, shuffle=True, drop_last=True,
                        num_workers=args.loader_workers, pin_memory=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16")
    model.train()
    start = None
    for i, (x, y) in enumerate(loader):
        if i == args.warmup_iters:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        if i == args.steps:
            break
        x, y = x.to(device, non_blocking=True, memory_format=fmt), y.to(device, non_blocking=True)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (args.steps - args.warmup_iters) * args.per_worker_batch / (time.perf_counter() - start)


def main(argv=None) -> int:
    p, own = parser(PROG, __doc__, steps=60, warmup=10)
    # The hand-written loop has no loss scaler, so fp16 would not be the same training.
    own.add_argument("--amp", choices=["none", "bf16"], default="none", help="mixed precision autocast, in both")
    own.add_argument("--repeats", type=int, default=3, help="alternating engine/hand measurements of each")
    own.add_argument("--min-ratio", type=float, default=0.97)
    args = parse(p, argv)

    engine, hand = [], []
    for _ in range(args.repeats):  # alternate, so drift in machine load hits both alike
        engine.append(engine_rate(args))
        hand.append(hand_rate(args))
    e, h = statistics.median(engine), statistics.median(hand)
    ratio = e / h
    print(f"engine {e:10.1f} img/s   hand-written loop {h:10.1f} img/s   ratio {ratio:.3f} "
          f"(median of {args.repeats}; {args.model}, batch {args.per_worker_batch}, image {args.image_size})")
    print(json.dumps({"benchmark": "engine_vs_hand_loop", "model": args.model, "per_worker_batch": args.per_worker_batch,
                      "image_size": args.image_size, "engine_images_per_second": engine,
                      "hand_images_per_second": hand, "ratio": ratio}))
    if ratio < args.min_ratio:
        print(f"FAIL: the engine is slower than the hand-written loop (ratio {ratio:.3f} < {args.min_ratio})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
