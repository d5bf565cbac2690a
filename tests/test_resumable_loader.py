"""The demos' training loader: the batches of a seeded shuffle, and a resume from its state at any batch goes on
with exactly the batches the uninterrupted loader hands out, epoch after epoch, consumed as Lightning consumes a
loader with a length (that many batches an epoch, then a new iterator)."""

import pytest
import torch
from lightning.fabric.utilities.types import _Stateful
from torch.utils.data import DataLoader, TensorDataset

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
