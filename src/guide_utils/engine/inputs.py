"""Batches onto the device: what the step gets, ready for the model.

:class:`DeviceFeed` takes a DataLoader's batches (pinned when the device is a GPU) and
puts each on the device: the copy, then there the conversion of uint8 images to normalised
float32 (``--input-dtype uint8``: 4x fewer bytes assembled by the workers, pinned and
copied than float32) and the channels_last layout. On a GPU the next batch is copied and
converted on a side CUDA stream while the current step computes; the step's stream waits
for it only when it needs it. On a CPU it does the same work in line, with no stream.

:class:`ResidentBatches` is ``--data synthetic-resident``: one random batch made on the
device once and handed out every step (Horovod's ``pytorch_synthetic_benchmark.py`` and
tf_cnn_benchmarks' synthetic method), so a run measures the device and the engine's own
step, nothing of the input path.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator


class DeviceFeed:
    """Copy, convert and lay out batches for ``device``; see the module doc.

    ``normalize``: the (mean, std) per channel of uint8 images in 0..255, as the data
    bundle gives it; the conversion is ``(x / 255 - mean) / std`` in float32, the same
    operations in the same order as torchvision's ToTensor and Normalize on the host.
    """

    def __init__(self, device, *, memory_format=None, normalize: tuple[list[float], list[float]] | None = None,
                 side_stream: bool | None = None):
        import torch

        self.device = device
        self.memory_format = memory_format or torch.contiguous_format
        self.mean = self.std = None
        if normalize is not None:
            self.mean = torch.tensor(normalize[0], dtype=torch.float32, device=device).view(1, -1, 1, 1)
            self.std = torch.tensor(normalize[1], dtype=torch.float32, device=device).view(1, -1, 1, 1)
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if (cuda if side_stream is None else side_stream and cuda) else None

    def prepare(self, images, target):
        """One batch on the device, converted, in the model's layout (on the current stream)."""
        import torch

        images = images.to(self.device, non_blocking=True)
        target = target.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            if self.mean is None:
                raise ValueError("uint8 images but no normalisation: build the feed with normalize=(mean, std)")
            images = images.to(torch.float32, memory_format=self._format(images)).div_(255)
            images = images.sub_(self.mean).div_(self.std)
        elif images.dim() == 4:
            images = images.contiguous(memory_format=self.memory_format)  # after the copy: the device lays it out
        return images, target

    def _format(self, images):
        import torch

        return self.memory_format if images.dim() == 4 else torch.contiguous_format

    def __call__(self, batches: Iterable) -> Iterator[tuple[Any, Any]]:
        """The batches of ``batches`` on the device, in the same order."""
        if self.stream is None:
            return (self.prepare(x, y) for x, y in batches)
        return self._overlapped(iter(batches))

    def _overlapped(self, it: Iterator) -> Iterator[tuple[Any, Any]]:
        import torch

        def start(item):
            with torch.cuda.stream(self.stream):
                return self.prepare(*item)

        pending = next(it, None)
        pending = start(pending) if pending is not None else None
        while pending is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)  # the batch is there before the step reads it
            for t in pending:
                # made on the side stream, used on this one: the allocator must not reuse the
                # memory until this stream is done with it
                t.record_stream(current)
            ready, nxt = pending, next(it, None)
            # the next batch's copy and conversion are queued now, behind nothing on the side
            # stream, so they run while the GPU computes the step the caller queues next
            pending = start(nxt) if nxt is not None else None
            yield ready


class ResidentBatches:
    """``len(sampler) // batch_size`` steps of one random batch made on ``device`` once.

    The batch is standard-normal images (already "normalised", like the float synthetic
    pool) and uniform labels, from a generator seeded by ``seed``; the sampler only counts:
    where an epoch starts (a resumed run) and how many steps it has.
    """

    def __init__(self, sampler, *, batch_size: int, input_shape: tuple[int, ...], num_classes: int, device,
                 seed: int, memory_format=None):
        import torch

        g = torch.Generator(device=device).manual_seed(seed)
        images = torch.randn(batch_size, *input_shape, generator=g, device=device)
        self.images = images.contiguous(memory_format=memory_format) if memory_format is not None else images
        self.target = torch.randint(0, num_classes, (batch_size,), generator=g, device=device)
        self.sampler, self.batch_size = sampler, batch_size

    def __len__(self) -> int:
        return max(1, len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        start = getattr(self.sampler, "start", 0)
        if hasattr(self.sampler, "set_start"):
            self.sampler.set_start(0)  # consumed, as the sampler itself would
        # at least one batch: a validation shard smaller than a batch still gets evaluated
        for _ in range(max(1 if start == 0 else 0, (len(self.sampler) - start) // self.batch_size)):
            yield self.images, self.target


class Inputs:
    """This rank's training and validation batches, on the device, and the sampler that can
    resume mid-epoch.

    Loader workers: ``cfg.loader_workers`` (``auto``: runtime.cpus.default_loader_workers of
    the rank's share of CPUs, ``Dist.cpus``, read from its launcher at init);
    on a GPU the loader pins its batches (so the copy can overlap) and keeps 4 batches per
    worker in flight, on a CPU 2 (PyTorch's default: pinning and depth buy nothing there).
    """

    def __init__(self, cfg, bundle, dist):
        import torch
        from torch.utils.data import DataLoader

        from ..runtime.cpus import default_loader_workers
        from .sampling import ResumableSampler, SeededItems, ShardSampler, collate

        cuda = dist.device.type == "cuda"
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.sampler = ResumableSampler(bundle.train, num_replicas=dist.size, rank=dist.rank, seed=cfg.seed)
        self.criterion = torch.nn.CrossEntropyLoss()
        self.feed = DeviceFeed(dist.device, memory_format=fmt, normalize=bundle.normalize)
        self.input_dtype = "uint8" if bundle.normalize else "float32"
        val_sampler = ShardSampler(bundle.val, num_replicas=dist.size, rank=dist.rank)
        if bundle.resident:
            self.workers, self.input_dtype = 0, "resident"
            kw = {"batch_size": cfg.per_worker_batch, "input_shape": bundle.input_shape,
                  "num_classes": bundle.num_classes, "device": dist.device, "memory_format": fmt}
            self.train = ResidentBatches(self.sampler, seed=cfg.seed, **kw)
            self.val = ResidentBatches(val_sampler, seed=cfg.seed + 1, **kw)
            return
        self.workers = cfg.loader_workers if cfg.loader_workers != "auto" else \
            default_loader_workers(dist.device.type, dist.cpus)
        kw: dict[str, Any] = {"num_workers": self.workers, "pin_memory": cuda, "collate_fn": collate}
        if self.workers > 0:
            kw.update(persistent_workers=True, prefetch_factor=4 if cuda else 2)
        # Only image folders carry random augmentation that needs per-sample seeding.
        augmented = os.path.isdir(cfg.data)
        self.train = DataLoader(SeededItems(bundle.train, cfg.seed, seeded=augmented),
                                batch_size=cfg.per_worker_batch, sampler=self.sampler, drop_last=True, **kw)
        self.val = DataLoader(SeededItems(bundle.val, cfg.seed, seeded=False), batch_size=cfg.per_worker_batch,
                              sampler=val_sampler, **kw)

    def train_batches(self) -> Iterator[tuple[Any, Any]]:
        # the resident batch is on the device in its layout already: nothing to feed
        return iter(self.train) if self.input_dtype == "resident" else self.feed(self.train)

    def val_batches(self) -> Iterator[tuple[Any, Any]]:
        return iter(self.val) if self.input_dtype == "resident" else self.feed(self.val)
