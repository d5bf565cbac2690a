"""What a user would pick instead of the plugin, as callbacks the harness adds to a plain run: Lightning's EMA
weight averaging, and schedule-free AdamW (or SGD, where the task trains with SGD)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, EMAWeightAveraging

EMA_DECAY = 0.99  # an average over about the last 100 steps: runs here are 400-1000 steps long


def ema() -> Callback:
    """Lightning's ``EMAWeightAveraging``: validation (and the end of ``fit``) sees the average."""
    return EMAWeightAveraging(decay=EMA_DECAY)


class ScheduleFree(Callback):
    """Trains the module with ``schedulefree``'s optimizer instead of its own (and without its LR schedule), at the
    module's learning rate and warmup: ``AdamWScheduleFree``, or ``SGDScheduleFree`` with momentum 0.9 and the rate
    scaled by 0.1 (the same step length as plain SGD) where the module trains with SGD. Calls the optimizer's
    ``train()``/``eval()`` around validation, as schedule-free optimizers need."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        import schedulefree

        original = pl_module.configure_optimizers

        def configure_optimizers() -> Any:
            own = original()
            own = own["optimizer"] if isinstance(own, dict) else own
            params = [p for p in pl_module.parameters() if p.requires_grad]
            lr, warmup = pl_module.hparams.lr, int(pl_module.hparams.get("warmup_steps", 0))
            if isinstance(own, torch.optim.SGD):
                return schedulefree.SGDScheduleFree(params, lr=lr * 0.1, momentum=0.9, warmup_steps=warmup)
            decay = own.param_groups[0].get("weight_decay", 0.0)
            return schedulefree.AdamWScheduleFree(params, lr=lr, warmup_steps=warmup, weight_decay=decay)

        pl_module.configure_optimizers = configure_optimizers

    @staticmethod
    def _mode(trainer: pl.Trainer, mode: str) -> None:
        for optimizer in trainer.optimizers:
            getattr(optimizer, mode)()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mode(trainer, "train")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.optimizers:
            self._mode(trainer, "eval")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.should_stop:
            self._mode(trainer, "train")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mode(trainer, "eval")


PEERS = {"ema": ema, "schedulefree": ScheduleFree}
