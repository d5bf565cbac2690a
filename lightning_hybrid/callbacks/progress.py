"""HybridProgressBar: Lightning's TQDM progress bar with the hybrid phase and the backward passes skipped."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar

from lightning_hybrid.callbacks.scheduler import find_scheduler


class HybridProgressBar(TQDMProgressBar):
    """Adds ``phase`` (warmup, full, predict, correct) and ``skipped`` (share of backward passes replaced by
    predictions so far) to the bar's metrics. Without a :class:`HybridScheduler` it is the plain TQDM bar, so one
    config serves plain and hybrid runs. Takes :class:`TQDMProgressBar`'s arguments."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        scheduler = find_scheduler(trainer)
        if scheduler is not None:
            metrics["phase"] = scheduler.phase.label
            metrics["skipped"] = f"{scheduler.counters.backward_skipped_pct:.1f}%"
        return metrics
