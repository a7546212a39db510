"""Data order and per-sample seeding that make a mid-epoch resume exact."""

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from guide_utils.core.config import make_config
from guide_utils.engine.sampling import ResumableSampler, SeededItems, ShardSampler, collate


def test_shards_are_disjoint_and_reshuffled_per_epoch():
    data = TensorDataset(torch.arange(100))
    samplers = [ResumableSampler(data, num_replicas=4, rank=r, seed=3) for r in range(4)]
    for s in samplers:
        s.set_epoch(0)
    epoch0 = [[i for _, i in s] for s in samplers]
    assert sorted(sum(epoch0, [])) == list(range(100))  # every sample once across the ranks
    samplers[0].set_epoch(1)
    assert [i for _, i in samplers[0]] != epoch0[0]


def test_starting_part_way_yields_the_rest_of_the_same_order_once():
    data = TensorDataset(torch.arange(50))
    s = ResumableSampler(data, num_replicas=2, rank=1, seed=0)
    s.set_epoch(7)
    full = list(s)
    s.set_start(10)
    assert list(s) == full[10:]
    assert list(s) == full  # the offset applies to one epoch only
    assert all(epoch == 7 for epoch, _ in full)


def test_shard_sampler_counts_every_sample_once():
    data = TensorDataset(torch.arange(10))
    shards = [list(ShardSampler(data, num_replicas=3, rank=r)) for r in range(3)]
    assert sorted(i for shard in shards for _, i in shard) == list(range(10))


class _Noisy(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.rand(3)  # stands in for a random augmentation


def test_seeded_items_depend_on_epoch_and_index_only():
    items = SeededItems(_Noisy(), seed=1)
    a = items[(2, 5)]
    torch.rand(100)  # whatever else consumed the global RNG must not matter
    assert torch.equal(items[(2, 5)], a)
    assert not torch.equal(items[(3, 5)], a) and not torch.equal(items[(2, 6)], a)
    before = torch.get_rng_state()
    items[(0, 0)]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is left alone


def test_tensors_in_memory_are_gathered_per_batch_into_the_per_item_batches():
    """The engine's loaders gather a batch of in-memory tensors at once: the same values,
    dtypes and order as per-item loading with torch's stacking, a short last batch included;
    a dataset with random transforms keeps its per-item seeding."""
    data = TensorDataset(torch.randn(50, 1, 8), torch.randint(0, 10, (50,)))
    for sampler, drop_last in ((ResumableSampler(data, num_replicas=2, rank=1, seed=4), True),
                               (ShardSampler(data, num_replicas=3, rank=0), False)):
        batches = {}
        for name, kw in (("gathered", {"collate_fn": collate}), ("per item", {})):
            items = SeededItems(data, seed=4, seeded=False)
            if name == "per item":
                items.__getitems__ = None  # torch's DataLoader then fetches item by item
            batches[name] = list(DataLoader(items, batch_size=7, sampler=sampler, drop_last=drop_last, **kw))
        assert len(batches["gathered"]) == len(batches["per item"]) > 1
        for (x, y), (x1, y1) in zip(batches["gathered"], batches["per item"]):
            assert torch.equal(x, x1) and torch.equal(y, y1) and (x.dtype, y.dtype) == (x1.dtype, y1.dtype)
        assert len(batches["gathered"][-1][1]) == (7 if drop_last else len(sampler) % 7)
    noisy = SeededItems(_Noisy(), seed=1).__getitems__([(2, 5), (2, 6)])
    assert isinstance(noisy, list) and torch.equal(noisy[0], SeededItems(_Noisy(), seed=1)[(2, 5)])


def test_profiles_share_everything_they_do_not_override():
    full, smoke = make_config("full"), make_config("smoke")
    assert (full.base_lr, full.base_batch, full.momentum, full.weight_decay) == (0.1, 256, 0.9, 1e-4)
    assert (smoke.base_lr, smoke.base_batch, smoke.momentum, smoke.weight_decay) == (0.1, 256, 0.9, 1e-4)
    assert full.milestones == (30, 60, 80) and full.epochs == 90 and full.model == "resnet50"
