"""How the plugin's ``hybrid/*`` scalars reach the loggers: on the batches Lightning logs (its
``log_every_n_steps``), at the step it logs the module's own values at, handed to each logger's ``log_metrics`` and
put in ``trainer.callback_metrics`` (a ``ModelCheckpoint`` or ``EarlyStopping`` may monitor them).

Not through ``self.log``: Lightning's result collection moves each logged value's record to its device at every
call, about 0.4 ms a value on a CPU, which for the dozen scalars was 5 ms a logged step, more than the plugin's
own work of 40 quiet steps (``benchmarks/results/host_work``). They are computed only on the batches Lightning
logs, and a quiet step's values wait on the device until read. The whole run's summary is written as JSON beside
the logs."""

from __future__ import annotations

import json
import os
from typing import Any

import torch


def logging_step(trainer: Any) -> bool:
    """Whether Lightning logs the step values of the batch now ending: every ``log_every_n_steps`` batches that
    stepped, the last batch of a fit that is stopping, every batch of a ``fast_dev_run`` (Lightning's own rule,
    read at ``on_train_batch_end``, before Lightning counts the batch)."""
    every = trainer.log_every_n_steps
    if every == 0:
        return False
    stepped = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # Lightning's count, not yet incremented
    return stepped % every == 0 or trainer.should_stop or bool(trainer.fast_dev_run)


def log_step(trainer: Any, metrics: dict[str, float]) -> None:
    """Hand a step's scalars to every logger and to ``trainer.callback_metrics``, from a callback's
    ``on_train_batch_end``: at the step Lightning logs this batch's ``self.log`` values at right after (its count of
    batches that stepped, not yet incremented), as every rank calls each logger, which writes on rank 0."""
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)
    trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})


def log_unverified(pl_module: Any, unverified: bool) -> None:
    """Whether a validation sees unverified weights (1) or verified ones (0), logged with its own metrics at its
    step (from a callback's ``on_validation_start``). Every rank holds the same value; ``sync_dist`` averages it
    over them once a validation, so Lightning has nothing to warn of, nor without a logger."""
    loggers = bool(pl_module.trainer.loggers)
    pl_module.log("hybrid/unverified", float(unverified), on_epoch=True, logger=loggers, batch_size=1, sync_dist=True)


def write_summary(trainer: Any, summary: dict[str, Any], directory: str | None, filename: str) -> None:
    """``summary`` as JSON to ``directory`` (by default where the Trainer's first logger keeps its logs; nowhere
    without a logger), from rank 0."""
    if directory is None and trainer.loggers:
        directory = trainer.log_dir  # a broadcast: every rank must ask
    if directory is not None and trainer.is_global_zero:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, filename), "w") as f:
            json.dump(summary, f, indent=2)
