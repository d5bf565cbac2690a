"""A small CNN on scikit-learn's bundled 8x8 digits images (1,797 of them, shipped inside scikit-learn).

Needs the optional extra ``pip install lightning-hybrid[examples]`` (scikit-learn); nothing is downloaded.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset, random_split
from torchmetrics.classification import MulticlassAccuracy

from lightning_hybrid.demos.splits import SplitData


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """Images scaled to [0, 1] as ``(N, 1, 8, 8)`` floats, and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # an optional extra, so say how to get it
        raise ImportError("the digits demo needs scikit-learn: pip install 'lightning-hybrid[examples]'") from err
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(digits.target, dtype=torch.long)


class DigitsData(SplitData):
    """Seeded train/validation split of the digits images.

    Args:
        batch_size: images per batch.
        val_fraction: share of the images held out for validation.
        seed: seed of the split and of the training shuffle.
        num_workers: dataloader worker processes.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__(val_fraction)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        data = TensorDataset(*load_digits_tensors())
        n_val = int(len(data) * hp.val_fraction)
        split = torch.Generator().manual_seed(hp.seed)
        self.train_set, self.val_set = random_split(data, [len(data) - n_val, n_val], generator=split)


class DigitsCNN(L.LightningModule):
    """Two conv layers and a linear classifier; an ordinary LightningModule that knows nothing of hybrid training."""

    def __init__(self, channels: int = 32, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.val_accuracy = MulticlassAccuracy(num_classes=10)
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * channels * 16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.val_accuracy(logits, y)
        self.log("val_acc", self.val_accuracy)  # accumulated over the epoch, synced across ranks

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
