"""Two CPU ranks that Lightning launches itself, as a user's script is launched: ``ddp`` (Lightning starts the second
rank as a process running this script again) or ``ddp_spawn`` (it spawns both, pickling the Trainer, its module and
its callbacks into them), with the plugin as one callback beside Lightning's own strategy.

    python -m tests.launched_ranks ddp|ddp_spawn <out>

Fits 48 steps, saving a checkpoint every 16 (an epoch's end); then a second Trainer resumes from step 32 to the
same end. Each rank writes its weights and the plugin's summary after each fit, to ``<out>/<fit>-rank<R>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import HybridScheduler
from lightning_hybrid.callbacks import find_scheduler
from tests.helpers import DEFAULT_JUMPING, RULE_PHASES, RegressionModel, flat_params, loader

STEPS, EVERY = 48, 16


class KeepWeights(L.Callback):
    """Writes this rank's weights, the plugin's summary and the strategy's class as the fit is torn down (after the
    plugin's callback, listed before it, gave the strategy its own class back)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        saved = {"params": flat_params(pl_module), "summary": find_scheduler(trainer).summary()}
        torch.save(saved | {"strategy": type(trainer.strategy).__name__}, f"{self.path}-rank{trainer.global_rank}.pt")


def fit(launcher: str, out: Path, name: str, ckpt_path: str | None = None) -> None:
    saving = ckpt_path is None
    callbacks = [HybridScheduler(**RULE_PHASES, **DEFAULT_JUMPING), KeepWeights(str(out / name))]
    if saving:
        callbacks.append(ModelCheckpoint(out / "ckpt", every_n_train_steps=EVERY, save_top_k=-1, filename="{step}"))
    trainer = two_ranks(launcher, STEPS, callbacks, saving, out)
    trainer.fit(RegressionModel(scheduler=True), loader(512, batch_size=16), ckpt_path=ckpt_path)


def two_ranks(strategy: Any, steps: int, callbacks: list[L.Callback], saving: bool, out: Path) -> L.Trainer:
    """A Trainer on two CPU ranks under ``strategy``, quiet (no logger, bar or summary), checkpointing if
    ``saving``."""
    return L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=saving,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=out,
    )


def main(launcher: str, out: Path) -> None:
    fit(launcher, out, "full")
    fit(launcher, out, "resumed", ckpt_path=str(out / "ckpt" / f"step={2 * EVERY}.ckpt"))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
