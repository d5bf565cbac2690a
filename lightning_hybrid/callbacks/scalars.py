"""How the plugin's ``hybrid/*`` scalars reach the loggers: through Lightning's own logging, as a module's
``self.log`` values do, so they share its steps, its calls to each logger and its ``log_every_n_steps``, and they
are in ``trainer.callback_metrics`` (a ``ModelCheckpoint`` or ``EarlyStopping`` may monitor them).

They are computed and handed over only on the batches Lightning logs, which keeps the host work of the other steps
at none: a ``self.log`` call costs tens of microseconds, and a quiet step's values wait on the device until read.
The whole run's summary is written as JSON beside the logs."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl

LOGGED = dict(on_step=True, on_epoch=False, prog_bar=False, logger=True, batch_size=1)


def logging_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning logs the step values of the batch now ending: every ``log_every_n_steps`` batches that
    stepped, the last batch of a fit that is stopping, every batch of a ``fast_dev_run`` (Lightning's own rule,
    read at ``on_train_batch_end``, before Lightning counts the batch)."""
    every = trainer.log_every_n_steps
    if every == 0:
        return False
    stepped = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # Lightning's count, not yet incremented
    return stepped % every == 0 or trainer.should_stop or bool(trainer.fast_dev_run)


def log_step(pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    """Hand a step's scalars to Lightning, from a callback's ``on_train_batch_end``."""
    pl_module.log_dict(metrics, **LOGGED)


def log_unverified(pl_module: pl.LightningModule, unverified: bool) -> None:
    """Whether a validation sees unverified weights (1) or verified ones (0), logged with its own metrics at its
    step (from a callback's ``on_validation_start``). Every rank holds the same value; ``sync_dist`` averages it
    over them once a validation, so Lightning has nothing to warn of, nor without a logger."""
    loggers = bool(pl_module.trainer.loggers)
    pl_module.log("hybrid/unverified", float(unverified), on_epoch=True, logger=loggers, batch_size=1, sync_dist=True)


def write_summary(trainer: pl.Trainer, summary: dict[str, Any], directory: str | None, filename: str) -> None:
    """``summary`` as JSON to ``directory`` (by default where the Trainer's first logger keeps its logs; nowhere
    without a logger), from rank 0."""
    if directory is None and trainer.loggers:
        directory = trainer.log_dir  # a broadcast: every rank must ask
    if directory is not None and trainer.is_global_zero:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, filename), "w") as f:
            json.dump(summary, f, indent=2)
