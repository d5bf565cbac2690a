"""The phase and what the mode has done so far, in whatever progress bar the Trainer has (Lightning's TQDM bar,
``RichProgressBar``, one of the user's own): the scheduler adds them to that bar's metrics for the fit, as a
partial on the bar instance (so it still pickles), and takes them back out after. ``HybridProgressBar`` stays as a
TQDM bar that shows a logger's string version whole."""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override


def _with_progress(bar: Any, scheduler: Any, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
    """The bar's own metrics, then the scheduler's: ``phase`` and the mode's counts (``jumps kept=5/7``)."""
    return {**type(bar).get_metrics(bar, trainer, pl_module), **scheduler.progress()}


def show_progress(trainer: pl.Trainer, scheduler: Any) -> None:
    """Add the scheduler's ``progress()`` to the Trainer's progress bar, if it has one, for this fit."""
    bar = trainer.progress_bar_callback
    if bar is not None:
        bar.get_metrics = partial(_with_progress, bar, scheduler)


def hide_progress(trainer: pl.Trainer) -> None:
    bar = trainer.progress_bar_callback
    if bar is not None and isinstance(bar.__dict__.get("get_metrics"), partial):
        del bar.__dict__["get_metrics"]


class HybridProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar showing a logger's string version whole (``v_num=hybrid``, where Lightning cuts it to its
    last four characters, ``brid``). Deprecated as the plugin's bar: the phase and the counts show in any bar now.
    Takes :class:`TQDMProgressBar`'s arguments."""

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        versions = dict.fromkeys(str(logger.version) for logger in trainer.loggers)  # as Lightning joins them
        version = trainer.loggers[0].version if len(trainer.loggers) == 1 else "_".join(versions) or None
        if isinstance(version, str) and "v_num" in metrics:
            metrics["v_num"] = version
        return metrics
