"""What the demo DataModules share: ``SplitData``, a checked train/validation split served by seeded loaders that
resume mid-epoch, and ``TokenWindows``, next-token windows over a sequence of ids."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Sampler


class SplitData(L.LightningDataModule):
    """Base of the demo DataModules. A subclass passes ``val_fraction`` here, saves its own arguments with
    ``save_hyperparameters()`` (they must include ``batch_size``, ``seed`` and ``num_workers``) and sets
    ``train_set`` and ``val_set`` in ``setup``."""

    train_set: Dataset
    val_set: Dataset

    def __init__(self, val_fraction: float) -> None:
        super().__init__()
        if not 0 < val_fraction < 1:
            raise ValueError(f"{type(self).__name__}: `val_fraction` must be in (0, 1), got {val_fraction}")

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        return ResumableLoader(self.train_set, hp.batch_size, seed=hp.seed, num_workers=hp.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, self.hparams.batch_size, num_workers=self.hparams.num_workers)


class TokenWindows(Dataset):
    """Next-token windows over a token-id tensor (bytes, words, ...)."""

    def __init__(self, ids: torch.Tensor, seq_len: int) -> None:
        self.ids, self.seq_len = ids, seq_len

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]


class EpochOrder(RandomSampler):
    """torch's shuffled order for ``DataLoader(shuffle=True, generator=...)``, which also remembers the generator's
    state where each epoch's permutation starts, so that a run can resume mid-epoch (:meth:`resume`)."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        super().__init__(dataset, generator=torch.Generator().manual_seed(seed))
        self.epoch_start = self.generator.get_state()
        self.pending: tuple[torch.Tensor, int] | None = None  # a resumed epoch's start, and the indices it read

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self.pending is not None:  # after the loader drew its base seed, as the interrupted epoch did
            state, skip = self.pending
            self.generator.set_state(state)
            self.pending = None
        self.epoch_start = self.generator.get_state()
        yield from itertools.islice(super().__iter__(), skip, None)

    def resume(self, epoch_start: torch.Tensor, skip: int) -> None:
        """The next epoch is the one that started at ``epoch_start``, ``skip`` indices in."""
        self.pending = (epoch_start, skip)


class EpochShard(DistributedSampler):
    """This rank's shard of the epoch's one permutation, as the ``DistributedSampler`` Lightning gives each rank
    draws it (from its seed and the epoch Lightning sets), able to start an epoch some indices in (:meth:`resume`)."""

    def __init__(self, given: DistributedSampler) -> None:
        super().__init__(given.dataset, given.num_replicas, given.rank, given.shuffle, given.seed, given.drop_last)
        self.skip = 0  # indices of the next epoch already served before a resume

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        yield from itertools.islice(super().__iter__(), skip, None)

    def resume(self, skip: int) -> None:
        self.skip = skip


class ResumableLoader(DataLoader):
    """Shuffled batches in :class:`EpochOrder`, which resume mid-epoch exactly: Lightning saves :meth:`state_dict`
    in every checkpoint and loads it before the epoch goes on (a loader with a length is not read ahead, so the
    batches served are the batches trained on). The same batches as ``DataLoader(shuffle=True, generator=...)``. On
    several ranks Lightning gives it a ``DistributedSampler`` (each rank its shard of one permutation), which resumes
    the same way (:class:`EpochShard`); any other sampler given is used as it is, without resuming."""

    def __init__(
        self, dataset: Dataset, batch_size: int, seed: int = 0, sampler: Sampler | None = None, **kwargs: Any
    ) -> None:
        if type(sampler) is DistributedSampler:
            sampler = EpochShard(sampler)
        self.order = sampler if sampler is not None else EpochOrder(dataset, seed)
        if isinstance(self.order, EpochOrder):
            kwargs["generator"] = self.order.generator
        super().__init__(dataset, batch_size, sampler=self.order, **kwargs)
        self.served = 0  # batches of the current epoch handed out

    def __iter__(self) -> Iterator[Any]:
        pending = getattr(self.order, "pending", None)  # EpochOrder's resumed epoch, or EpochShard's skip
        skip = self.order.skip if isinstance(self.order, EpochShard) else pending[1] if pending else 0
        self.served = skip // self.batch_size
        for batch in super().__iter__():
            self.served += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.order, EpochShard):
            return {"served": self.served}
        if not isinstance(self.order, EpochOrder):
            return {}
        return {"generator": self.order.epoch_start, "served": self.served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(self.order, EpochShard) and "served" in state:
            if state["served"] < len(self):  # an epoch over: the next one is drawn from its own epoch number
                self.order.resume(state["served"] * self.batch_size)
            return
        if not state or not isinstance(self.order, EpochOrder) or "generator" not in state:
            return
        if state["served"] < len(self):
            self.order.resume(state["generator"], state["served"] * self.batch_size)
            return
        # The epoch was over: draw its batches again as Lightning drew them (it stops at the loader's length, so a
        # shuffle that ends on a full batch never asks the sampler for more), and the next epoch starts as it would.
        self.order.generator.set_state(state["generator"])
        batches = iter(self.batch_sampler)
        for _ in range(len(self)):
            next(batches)
