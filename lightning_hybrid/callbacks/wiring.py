"""What the ``HybridScheduler`` checks and finds in a Trainer before training starts: its component callbacks, the
gradients the engine can read, and the step at which training will end."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from lightning_hybrid.callbacks.base import HybridComponent


def find_component(trainer: pl.Trainer, scheduler: pl.Callback, kind: type, default: bool) -> Any:
    """The trainer's ``kind`` component. A missing required one is built with its defaults and placed right after
    the scheduler, so that Lightning runs its hooks and checkpoints it like any listed callback: a config file
    (LightningCLI) needs only the strategy and the scheduler. Two of a kind are refused."""
    matches = [cb for cb in trainer.callbacks if isinstance(cb, kind)]
    if len(matches) > 1:
        present = sorted(type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, HybridComponent))
        raise MisconfigurationException(
            f"HybridScheduler takes at most one {kind.__name__} callback, found {len(matches)} "
            f"(hybrid callbacks present: {present})."
        )
    if matches or not default:
        return matches[0] if matches else None
    component = kind()
    trainer.callbacks.insert(trainer.callbacks.index(scheduler) + 1, component)
    rank_zero_info(f"hybrid: no {kind.__name__} among the callbacks; using one with its default settings")
    return component


def refuse_sparse_gradients(module: pl.LightningModule) -> None:
    """The engine's fused norms and update capture need dense gradients."""
    sparse = [
        f"{name}.weight" if name else "weight"
        for name, m in module.named_modules()
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
    ]
    if sparse:
        raise MisconfigurationException(
            f"Hybrid training needs dense gradients, but {sparse} would get sparse ones (`sparse=True` on the "
            "embedding). Build the embedding with sparse=False, or train this model without the hybrid callbacks."
        )


def last_step(trainer: pl.Trainer) -> int | None:
    """The global step at which ``fit`` will end, from ``max_steps`` or the epochs; ``None`` where it is open."""
    total = trainer.estimated_stepping_batches
    return int(total) if math.isfinite(total) else None
