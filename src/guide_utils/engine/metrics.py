"""Loss and top-1/top-5 error, summed on the device and reduced over all ranks once per
epoch (a per-iteration ``.item()`` would synchronise the GPU every step, and so would a
tensor made from a host number on the device: a blocking host-to-device copy)."""

from __future__ import annotations

import math


def _hits(output, target, k: int = 5):
    """``hits[i, r]``: sample i's target is its output's r-th largest class, r < min(k, classes)."""
    return output.topk(min(k, output.shape[1]), dim=1).indices.eq(target.unsqueeze(1))


class Sums:
    """Loss x samples, top-1 hits, top-5 hits and samples over the steps of an epoch.

    Per step the device adds the loss x samples (float64) and how many samples had their
    target at each rank of the top 5 (top-1 hits: rank 0; top-5 hits: all five, since a
    target appears at most once among them): five small kernels, and nothing copied from
    the host (a tensor made from a host number would be a blocking copy on a GPU). The
    sample count is known on the host and added there.
    """

    def __init__(self, device):
        import torch

        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.ranks = None  # int64 hits per rank, made by the first add
        self.carried = [0.0, 0.0, 0.0]  # top-1 hits, top-5 hits, samples of an interrupted epoch
        self.samples = 0

    def restore(self, partial: list[float]) -> None:
        """Continue from the four sums of an epoch a stop interrupted (the checkpoint's)."""
        self.loss += partial[0]  # first, so the losses add up in the unbroken run's order
        self.carried = [float(x) for x in partial[1:]]

    def add(self, loss, output, target) -> None:
        n = target.shape[0]
        counts = _hits(output.detach(), target).sum(dim=0)
        self.ranks = counts if self.ranks is None else self.ranks.add_(counts)
        # one kernel: the float32 loss times the whole number n is exact in float64, so this is
        # the separate cast, multiply and add, bit for bit
        self.loss.add_(loss.detach(), alpha=n)
        self.samples += n

    def totals(self, dist) -> list[float]:
        """The four sums over every rank."""
        import torch

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
            sums.add(loss.float(), output.float(), target)
    return sums.reduced(dist)
