"""Data order and augmentation randomness that survive a restart in the middle of an epoch.

Two things make a resumed run repeat the unbroken one exactly:

* the order of samples depends only on (seed, epoch), never on how far the process got, and
  a resumed epoch can start at any position (:class:`ResumableSampler`);
* each sample's random augmentation is drawn from a generator seeded by (seed, epoch,
  index) (:class:`SeededItems`), so it does not depend on which DataLoader worker happened
  to load it, how many workers there are, or what ran before.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    """A DistributedSampler (one shard per rank, reshuffled by ``set_epoch``) that yields
    ``(epoch, index)`` pairs and can start an epoch part-way through.

    Yielding the epoch with each index lets :class:`SeededItems` seed augmentation per
    epoch even in persistent worker processes, which never see ``set_epoch`` calls.
    """

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int, seed: int, shuffle: bool = True,
                 drop_last: bool = True):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.start = 0

    def set_start(self, position: int) -> None:
        """Skip the first ``position`` samples of this rank's shard for the current epoch only."""
        self.start = position

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = list(super().__iter__())[self.start:]
        self.start = 0  # the next epoch starts from its beginning
        return iter([(self.epoch, i) for i in indices])


class ShardSampler(torch.utils.data.Sampler):
    """Evaluation order: this rank's share of the dataset without padding or duplicates,
    so the summed metrics over all ranks count every sample exactly once."""

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int):
        self.indices = list(range(rank, len(dataset), num_replicas))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter([(0, i) for i in self.indices])

    def __len__(self) -> int:
        return len(self.indices)


class SeededItems(Dataset):
    """Wrap a dataset so item ``(epoch, i)`` is transformed under its own fixed seed.

    With ``seeded=False`` (datasets without random transforms) it only unpacks the key:
    re-seeding costs tens of microseconds per item, which a tiny model would notice.
    """

    def __init__(self, dataset: Dataset, seed: int, seeded: bool = True):
        self.dataset = dataset
        self.seed = seed
        self.seeded = seeded

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        if not self.seeded:
            return self.dataset[index]
        # fork_rng restores the caller's RNG afterwards, so training randomness in the main
        # process (loader_workers=0) is unaffected.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(((self.seed * 1_000_003 + epoch) * 1_000_000_007 + index) % 2**63)
            return self.dataset[index]

    def __getitems__(self, keys: list[tuple[int, int]]):
        """A batch's items. From tensors in memory (MNIST-1D, digits) without random
        transforms: one gather per tensor, the rows a per-item loop would stack, in the same
        order (``collate``); a per-item loop and stack cost 10 times more at 1024 per batch."""
        tensors = getattr(self.dataset, "tensors", None)
        if self.seeded or tensors is None:
            return [self[key] for key in keys]
        index = torch.as_tensor([i for _, i in keys], dtype=torch.int64)
        return Gathered(t[index] for t in tensors)


class Gathered(tuple):
    """A batch already gathered (``SeededItems.__getitems__``): ``collate`` passes it through."""


def collate(items):
    """The DataLoader's collate: a gathered batch as it is, a list of items as torch stacks them."""
    from torch.utils.data import default_collate

    return tuple(items) if isinstance(items, Gathered) else default_collate(items)
