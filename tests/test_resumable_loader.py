"""The demos' training loader: the batches of a seeded shuffle, and a resume from its state at any batch goes on
with exactly the batches the uninterrupted loader hands out, epoch after epoch, consumed as Lightning consumes a
loader with a length (that many batches an epoch, then a new iterator)."""

import pytest
import torch
from lightning.fabric.utilities.types import _Stateful
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_hybrid.demos.splits import ResumableLoader


def _epochs(loader, count: int, first: int = 0) -> list[list[int]]:
    out = []
    for epoch in range(count):
        batches = iter(loader)
        out += [next(batches)[0].tolist() for _ in range(len(loader) - (first if epoch == 0 else 0))]
    return out


@pytest.mark.parametrize(("size", "batch"), [(20, 3), (21, 3), (7, 7), (12, 4)])  # last batch partial or full
def test_the_order_is_a_seeded_shuffles_and_resumes_at_every_batch(size, batch):
    data = TensorDataset(torch.arange(size))
    shuffled = DataLoader(data, batch, shuffle=True, generator=torch.Generator().manual_seed(3))
    reference = _epochs(shuffled, 3)
    assert _epochs(ResumableLoader(data, batch, seed=3), 3) == reference
    per_epoch = len(reference) // 3
    for cut in range(1, len(reference)):
        loader = ResumableLoader(data, batch, seed=3)
        done, part = divmod(cut, per_epoch)
        seen = _epochs(loader, done)
        if part:
            batches = iter(loader)
            seen += [next(batches)[0].tolist() for _ in range(part)]
        resumed = ResumableLoader(data, batch, seed=3)
        resumed.load_state_dict(loader.state_dict())
        rest = _epochs(resumed, 3 - done, first=part)
        assert seen + rest == reference, cut


def test_lightning_sees_the_loader_as_resumable():
    assert isinstance(ResumableLoader(TensorDataset(torch.arange(4)), 2), _Stateful)


def test_each_ranks_shard_of_one_permutation_resumes_at_every_batch():
    """On several ranks Lightning gives the loader a ``DistributedSampler``: each rank's shard of one permutation,
    disjoint from the other's, which resumes mid-epoch as the single-rank order does."""
    data = TensorDataset(torch.arange(40))

    def rank(r: int) -> ResumableLoader:
        return ResumableLoader(data, 4, sampler=DistributedSampler(data, 2, r, shuffle=True, seed=5))

    def epochs(loader: ResumableLoader) -> list[list[int]]:
        out = []
        for epoch in range(2):
            loader.order.set_epoch(epoch)  # as Lightning does at each epoch's start
            out += [batch[0].tolist() for batch in loader]
        return out

    reference = [epochs(rank(r)) for r in (0, 1)]
    for epoch in (slice(0, 5), slice(5, 10)):
        shards = [{i for batch in ref[epoch] for i in batch} for ref in reference]
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(40))
    for cut in range(1, 5):
        loader = rank(0)
        loader.order.set_epoch(0)
        batches = iter(loader)
        seen = [next(batches)[0].tolist() for _ in range(cut)]
        resumed = rank(0)
        resumed.load_state_dict(loader.state_dict())
        assert seen + epochs(resumed) == reference[0], cut
