"""Loss and top-1/top-5 error, summed on the device and reduced over all ranks once per
epoch (a per-iteration ``.item()`` would synchronise the GPU every step, and so would a
tensor made from a host number on the device: a blocking host-to-device copy)."""

from __future__ import annotations

import math

HOLD_STEPS = 16  # steps whose top-5 hits Sums counts together (see Sums)


def _hits(output, target, k: int = 5):
    """``hits[i, r]``: sample i's target is its output's r-th largest class, r < min(k, classes)."""
    return output.topk(min(k, output.shape[1]), dim=1).indices.eq(target.unsqueeze(1))


class Sums:
    """Loss x samples, top-1 hits, top-5 hits and samples over the steps of an epoch.

    Per step the device adds the loss x samples (float64; one kernel) and the host the sample
    count. The top-5 hits are counted for ``hold`` steps at once: each step's output and
    target are only kept (references, no copy) and counted together when ``hold`` are kept,
    or 64 MiB of outputs, and at the end. On a GPU each small kernel costs the host more to
    launch than to run (top-k alone queries the device's occupancy every call: about 80 us on
    an H100's host, 2026-11-27), so counting 16 steps in one go takes that off the step. The
    counts are the same: top-k works row by row. ``hold=1`` counts every step, for outputs
    that a CUDA graph overwrites at its next replay. Nothing is made from host numbers (on a
    GPU a blocking copy).
    """

    HOLD_BYTES = 64 * 2**20

    def __init__(self, device, hold: int = HOLD_STEPS):
        import torch

        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.ranks = None  # int64 hits per rank of the top 5, made by the first count
        self.carried = [0.0, 0.0, 0.0]  # top-1 hits, top-5 hits, samples of an interrupted epoch
        self.samples = 0
        self.hold = max(1, int(hold))
        self._held: list = []  # (output, target) of steps not counted yet
        self._held_bytes = 0

    def restore(self, partial: list[float]) -> None:
        """Continue from the four sums of an epoch a stop interrupted (the checkpoint's)."""
        self.loss += partial[0]  # first, so the losses add up in the unbroken run's order
        self.carried = [float(x) for x in partial[1:]]

    def add(self, loss, output, target) -> None:
        n = target.shape[0]
        # one kernel: the float32 loss times the whole number n is exact in float64, so this is
        # the separate cast, multiply and add, bit for bit
        self.loss.add_(loss.detach().float(), alpha=n)
        self.samples += n
        output = output.detach()  # kept, not its autograd graph
        self._held.append((output, target))
        self._held_bytes += output.numel() * output.element_size()
        if len(self._held) >= self.hold or self._held_bytes >= self.HOLD_BYTES:
            self._count()

    def _count(self) -> None:
        """Top-1 and top-5 hits of the kept steps, added to ``ranks`` in a few kernels."""
        if not self._held:
            return
        import torch

        outputs, targets = zip(*self._held)
        self._held, self._held_bytes = [], 0
        output = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        target = targets[0] if len(targets) == 1 else torch.cat(targets)
        counts = _hits(output.float(), target).sum(dim=0)
        self.ranks = counts if self.ranks is None else self.ranks.add_(counts)

    def totals(self, dist) -> list[float]:
        """The four sums over every rank."""
        import torch

        self._count()
        ranks = self.ranks.cpu() if self.ranks is not None else torch.zeros(1, dtype=torch.int64)
        c1, c5, n = self.carried
        t = torch.stack([self.loss.cpu(), (ranks[0] + c1).double(), (ranks.sum() + c5).double(),
                         torch.tensor(n + self.samples, dtype=torch.float64)])
        return (dist.allreduce_mean(t, name="sums") * dist.size).tolist()

    def reduced(self, dist) -> dict[str, float]:
        loss, c1, c5, n = self.totals(dist)
        if n == 0:
            return {"loss": math.nan, "top1_err": math.nan, "top5_err": math.nan}
        return {"loss": loss / n, "top1_err": 100.0 * (1 - c1 / n), "top5_err": 100.0 * (1 - c5 / n)}


def evaluate(state, batches, criterion, dist) -> dict[str, float]:
    """Validation loss and top-1/top-5 error over ``batches`` (the whole validation set, on
    the device), all ranks summed."""
    import torch

    state.module.eval()
    sums = Sums(dist.device)
    with torch.no_grad():
        for images, target in batches:
            with state.autocast():
                output = state.module(images)
                loss = criterion(output, target)
            sums.add(loss, output, target)
    return sums.reduced(dist)
