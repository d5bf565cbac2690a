"""One permutation for all ranks. Lightning shards a loader's sampler over the ranks with torch's
``DistributedSampler`` where the sampler is torch's own ``RandomSampler`` or ``SequentialSampler``, and wraps any
other in a ``DistributedSamplerWrapper``. torchdata's ``StatefulDataLoader(shuffle=True)`` brings torchdata's own
``RandomSampler``, so it gets the wrapper, which draws each epoch's order from each rank's own generator: the ranks'
shards can overlap, and a resumed epoch is drawn anew, so its saved place points into another order. The multi-rank
strategies of this package give such a loader torchdata's ``StatefulDistributedSampler`` instead: one permutation
from Lightning's seed, sharded, which the loader's checkpointed state resumes mid-epoch."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from lightning_hybrid.lightning_packages import classes, module


def _shuffled_by_torchdata(sampler: Any) -> bool:
    """torchdata's shuffling sampler as ``StatefulDataLoader(shuffle=True)`` makes it: every index once an epoch."""
    try:
        from torchdata.stateful_dataloader.sampler import RandomSampler
    except ImportError:
        return False
    return type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None


def one_permutation(loader: object) -> object:
    """``loader`` with Lightning's ``DistributedSamplerWrapper`` around torchdata's shuffling sampler replaced by a
    ``StatefulDistributedSampler`` of the same ranks, seed and ``drop_last``; any other loader as it is."""
    if not isinstance(loader, DataLoader):
        return loader
    # Lightning rebuilds a loader whose batch sampler is not torch's own (torchdata's is a subclass) around it
    samplers = (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
    wrappers = classes("fabric.utilities.distributed", "DistributedSamplerWrapper")
    wrapper = next((s for s in samplers if type(s) in wrappers), None)
    if wrapper is None or not _shuffled_by_torchdata(wrapper.dataset._sampler):
        return loader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    sampler = StatefulDistributedSampler(
        loader.dataset,
        num_replicas=wrapper.num_replicas,
        rank=wrapper.rank,
        shuffle=True,
        seed=wrapper.seed,
        drop_last=wrapper.drop_last,
    )
    return module("pytorch.utilities.data")._update_dataloader(loader, sampler)
