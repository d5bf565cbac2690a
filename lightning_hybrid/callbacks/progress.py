"""HybridProgressBar: Lightning's TQDM progress bar with the hybrid phase and what the mode has done so far."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override

from lightning_hybrid.callbacks.scheduler import find_scheduler


class HybridProgressBar(TQDMProgressBar):
    """Adds the hybrid ``phase`` and the mode's running counts to the bar's metrics: under the default rule the
    jumps kept of those made (``jumps kept=5/7``, and ``undone=2`` once any was undone); in the per-step mode the
    share of backward passes replaced by predictions (``skipped``). Shows a logger's string version whole
    (``v_num=hybrid``, where Lightning cuts it to its last four characters, ``brid``). Without a
    :class:`HybridScheduler` it is the plain TQDM bar, so one config serves plain and hybrid runs. Takes
    :class:`TQDMProgressBar`'s arguments."""

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        versions = dict.fromkeys(str(logger.version) for logger in trainer.loggers)  # as Lightning joins them
        version = trainer.loggers[0].version if len(trainer.loggers) == 1 else "_".join(versions) or None
        if isinstance(version, str) and "v_num" in metrics:
            metrics["v_num"] = version
        scheduler = find_scheduler(trainer)
        if scheduler is not None:
            metrics.update(scheduler.progress())
        return metrics
