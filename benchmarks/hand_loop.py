"""The references the benchmarks hold the engine against: the simplest careful loops that
train the same model on the same input, written by hand (deliberately not the engine).

* :func:`rate` over the engine's own dataset and loader settings (workers, pinned memory,
  4 batches in flight per worker on a GPU, uint8 normalised on the device, channels_last
  applied on the device after the copy): what the engine's step and data path may cost at
  most;
* with ``resident=True``, one random batch on the device reused every step (Horovod's
  ``pytorch_synthetic_benchmark.py`` method): what the device does when nothing feeds it.

Both synchronise the GPU where the timing starts and where it ends, and nowhere else.
"""

from __future__ import annotations

import time


def device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_and_optimizer(args, dev, input_shape, num_classes):
    import torch

    from guide_utils.engine.models import build_model

    torch.manual_seed(0)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = build_model(args.model, num_classes=num_classes, input_shape=input_shape).to(dev).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    return model.train(), opt, fmt


def loader_batches(args, dev):
    """(batches, input shape, classes, what it is) over the engine's dataset for ``args``."""
    import torch
    from torch.utils.data import DataLoader

    from guide_utils.data.loaders import build_data, resolve_input_dtype
    from guide_utils.runtime.cpus import default_loader_workers

    dtype = resolve_input_dtype(getattr(args, "input_dtype", None) or "auto", "synthetic", dev.type)
    bundle = build_data("synthetic", image_size=args.image_size, seed=0, input_dtype=dtype,
                        synthetic_size=args.per_worker_batch * (args.steps + 1))
    workers = args.loader_workers if args.loader_workers not in (None, "auto") else default_loader_workers(dev.type)
    kw = {"persistent_workers": False, "prefetch_factor": 4 if dev.type == "cuda" else 2} if workers else {}
    loader = DataLoader(bundle.train, batch_size=args.per_worker_batch, shuffle=True, drop_last=True,
                        num_workers=workers, pin_memory=dev.type == "cuda", **kw)
    scale = None
    if bundle.normalize:
        mean, std = (torch.tensor(v, device=dev).view(1, 3, 1, 1) for v in bundle.normalize)
        scale = (mean, std)
    return loader, scale, bundle, f"loader ({workers} workers, {dtype})"


def rate(args, *, resident: bool = False) -> float:
    """Images/s of ``args.steps`` steps, the first ``args.warmup_iters`` untimed."""
    import torch

    dev = device()
    shape = (3, args.image_size, args.image_size)
    if resident:
        model, opt, fmt = model_and_optimizer(args, dev, shape, 1000)
        x = torch.randn(args.per_worker_batch, *shape, device=dev).contiguous(memory_format=fmt)
        y = torch.randint(0, 1000, (args.per_worker_batch,), device=dev)
        batches, scale = ((x, y) for _ in range(args.steps)), None
    else:
        loader, scale, bundle, _ = loader_batches(args, dev)
        model, opt, fmt = model_and_optimizer(args, dev, bundle.input_shape, bundle.num_classes)
        batches = iter(loader)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.amp == "bf16")
    start = None
    for i, (x, y) in enumerate(batches):
        if i == args.warmup_iters:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        if i == args.steps:
            break
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        if scale is not None:
            x = x.to(torch.float32, memory_format=fmt).div_(255).sub_(scale[0]).div_(scale[1])
        else:
            x = x.contiguous(memory_format=fmt)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (args.steps - args.warmup_iters) * args.per_worker_batch / (time.perf_counter() - start)
