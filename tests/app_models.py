"""A user's own LightningModule and DataModule, for the training app's ``model._target_`` test."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class UserRegression(L.LightningModule):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class UserData(L.LightningDataModule):
    def __init__(self, size: int = 128) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(size, 4, generator=g)
        self.data = TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=64)
