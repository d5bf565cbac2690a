"""What every hybrid callback shares: it only makes sense under a hybrid strategy."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException


class HybridComponent(Callback):
    """Base of the hybrid callbacks; refuses to run a ``fit`` without a hybrid strategy."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from lightning_hybrid.strategy import HybridStrategyMixin

        if stage == "fit" and not isinstance(trainer.strategy, HybridStrategyMixin):
            raise MisconfigurationException(
                f"{type(self).__name__} needs a hybrid strategy, but the Trainer uses "
                f"{type(trainer.strategy).__name__}. Pass `strategy=HybridPredictStrategy()` to the Trainer "
                '(or `strategy="hybrid"`; `"hybrid_ddp"` for several devices).'
            )
