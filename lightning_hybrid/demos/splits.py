"""What the demo DataModules share: ``SplitData``, a checked train/validation split served by seeded loaders, and
``TokenWindows``, next-token windows over a sequence of ids."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


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
        generator = torch.Generator().manual_seed(hp.seed)
        return DataLoader(self.train_set, hp.batch_size, shuffle=True, generator=generator, num_workers=hp.num_workers)

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
