"""Two CPU ranks that Lightning launches itself, as a user's script is launched: ``ddp`` (Lightning starts the second
rank as a process running this script again) or ``ddp_spawn`` (it spawns both, pickling the Trainer, its module and
its callbacks into them), with the plugin as one callback beside Lightning's own strategy, in a Trainer of
``lightning`` or of the standalone ``pytorch_lightning``.

    python -m tests.launched_ranks ddp|ddp_spawn lightning|pytorch_lightning <out>

Fits 48 steps, saving a checkpoint every 16 (an epoch's end); then a second Trainer resumes from step 32 to the
same end. Each rank writes its weights and the plugin's summary after each fit, to ``<out>/<fit>-rank<R>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import pytorch_lightning
import torch

from lightning_hybrid import HybridScheduler
from lightning_hybrid.callbacks import find_scheduler
from tests.helpers import DEFAULT_JUMPING, RULE_PHASES, RegressionModel, StandaloneRegression, flat_params, loader

STEPS, EVERY = 48, 16


class _KeepWeights:
    """Writes this rank's weights, the plugin's summary and the strategy's class as the fit is torn down."""

    def __init__(self, path: str) -> None:
        self.path = path

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        saved = {"params": flat_params(pl_module), "summary": find_scheduler(trainer).summary()}
        torch.save(saved | {"strategy": type(trainer.strategy).__name__}, f"{self.path}-rank{trainer.global_rank}.pt")


class KeepWeights(_KeepWeights, L.Callback):
    pass


class StandaloneKeepWeights(_KeepWeights, pytorch_lightning.Callback):
    pass


# each package: its module, and the callback that keeps the weights (spawned ranks unpickle both by name)
PACKAGES = {"lightning": (L.pytorch, RegressionModel, KeepWeights)}
PACKAGES["pytorch_lightning"] = (pytorch_lightning, StandaloneRegression, StandaloneKeepWeights)


def fit(launcher: str, package_name: str, out: Path, name: str, ckpt_path: str | None = None) -> None:
    package, module, keep = PACKAGES[package_name]
    saving = ckpt_path is None
    callbacks = [HybridScheduler(**RULE_PHASES, **DEFAULT_JUMPING), keep(str(out / name))]
    if saving:
        every = dict(every_n_train_steps=EVERY, save_top_k=-1, filename="{step}")
        callbacks.append(package.callbacks.ModelCheckpoint(out / "ckpt", **every))
    trainer = two_ranks(package, launcher, STEPS, callbacks, saving, out)
    trainer.fit(module(scheduler=True), loader(512, batch_size=16), ckpt_path=ckpt_path)


def two_ranks(package: ModuleType, strategy: Any, steps: int, callbacks: list, saving: bool, out: Path) -> Any:
    """A Trainer of ``package`` on two CPU ranks under ``strategy``, quiet (no logger, bar or summary),
    checkpointing if ``saving``."""
    return package.Trainer(
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


def main(launcher: str, package: str, out: Path) -> None:
    fit(launcher, package, out, "full")
    fit(launcher, package, out, "resumed", ckpt_path=str(out / "ckpt" / f"step={2 * EVERY}.ckpt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
