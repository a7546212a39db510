"""Loss and top-1/top-5 error, summed on the device and reduced over all ranks once per
epoch (a per-iteration ``.item()`` would synchronise the GPU every step, and so would a
tensor made from a host number on the device: a blocking host-to-device copy)."""

from __future__ import annotations

import math


def _topk_correct(output, target, ks=(1, 5)):
    k_max = min(max(ks), output.shape[1])
    pred = output.topk(k_max, dim=1).indices
    hits = pred.eq(target.unsqueeze(1))
    return [hits[:, : min(k, k_max)].any(dim=1).sum() for k in ks]


class Sums:
    """Loss x samples, top-1 hits, top-5 hits and samples, as one float64 tensor.

    The sample count is known on the host: it is added there, and the device only adds the
    three sums it computes (no host value is copied to the device in the step).
    """

    def __init__(self, device):
        import torch

        self.t = torch.zeros(4, dtype=torch.float64, device=device)
        self.zero = torch.zeros((), dtype=torch.float64, device=device)  # the count's slot, made once
        self.samples = 0

    def add(self, loss, output, target) -> None:
        import torch

        c1, c5 = _topk_correct(output.detach(), target)
        n = target.shape[0]
        self.t += torch.stack([loss.detach().double() * float(n), c1.double(), c5.double(), self.zero])
        self.samples += n

    def totals(self, dist) -> list[float]:
        """The four sums over every rank."""
        t = self.t.cpu()
        t[3] += self.samples
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
