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
    """``shuffle``: an ordinary ``DataLoader(shuffle=True)``, its order drawn from the global random state."""

    def __init__(self, size: int = 128, shuffle: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(size, 4, generator=g)
        self.data, self.shuffle = TensorDataset(x, x.sum(1, keepdim=True)), shuffle

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=16, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=64)


class KillAt(L.Callback):
    """Kills its own process with SIGKILL as step ``step`` starts: a run that dies mid-way, with no chance to save
    or clean up (the checkpoint of the step before is on disk, written when that step ended)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


class StopAt(L.Callback):
    """Stops training after step ``step``, as a run cut short would (``EarlyStopping``, ``max_time``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


class LoadDuringHybrid(L.Callback):
    """Three busy loops beside the hybrid half of ``mode=compare`` only, on the core that half runs on: a machine
    whose load changed between the two runs, as when another job starts, on any count of cores."""

    def __init__(self) -> None:
        from contextlib import ExitStack

        self.load = ExitStack()

    def on_train_start(self, trainer, pl_module):
        from lightning_hybrid.callbacks import find_scheduler
        from tests.helpers import cpu_bound

        if find_scheduler(trainer) is not None:
            self.load.enter_context(cpu_bound(3, share_a_core=True))

    def teardown(self, trainer, pl_module, stage):
        self.load.close()
