"""What the ``HybridScheduler`` checks and finds in a Trainer before training starts: its component callbacks, the
gradients the engine can read, the step at which training will end, and what it warns about (settings the mode does
not read, a fit too short for any prediction)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.routing import changed_from_default, ignored, ignored_message, mode_of
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import PredictionFamily
from lightning_hybrid.engine.family import ALL_MONITOR_SETTINGS, ALL_PHASE_SETTINGS


def find_component(
    trainer: pl.Trainer, scheduler: pl.Callback, kind: type, build: Callable[[], Any] | None, notice: bool = False
) -> Any:
    """The trainer's ``kind`` component. A missing one is made by ``build`` (left missing without it) and placed
    right after the scheduler, so that Lightning runs its hooks and checkpoints it like any listed callback: a
    config file (LightningCLI) needs only the strategy and the scheduler. ``notice``: say that it was built with its
    defaults. Two of a kind are refused."""
    matches = [cb for cb in trainer.callbacks if isinstance(cb, kind)]
    if len(matches) > 1:
        present = sorted(type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, HybridComponent))
        raise MisconfigurationException(
            f"HybridScheduler takes at most one {kind.__name__} callback, found {len(matches)} "
            f"(hybrid callbacks present: {present})."
        )
    if matches or build is None:
        return matches[0] if matches else None
    component = build()
    trainer.callbacks.insert(trainer.callbacks.index(scheduler) + 1, component)
    if notice:
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


def refuse_untrainable(module: pl.LightningModule) -> None:
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(
            f"{type(module).__name__} has no trainable parameters (none with requires_grad=True); "
            "hybrid training needs at least one."
        )


def last_step(trainer: pl.Trainer) -> int | None:
    """The global step at which ``fit`` will end, from ``max_steps`` or the epochs; ``None`` where it is open."""
    total = trainer.estimated_stepping_batches
    return int(total) if math.isfinite(total) else None


def find_own(trainer: pl.Trainer, scheduler: pl.Callback, own: Any, given: list[str] | None) -> Any:
    """The listed component of ``own``'s kind, or the scheduler's ``own`` (placed among the callbacks). Settings
    given to the scheduler for that component while another of its kind is listed are refused: which would win is
    not the plugin's to guess."""
    found = find_component(trainer, scheduler, type(own), lambda: own)
    if found is not own and given:
        raise MisconfigurationException(
            f"HybridScheduler was given {given}, settings of its {type(own).__name__}, but the Trainer also lists a "
            f"{type(own).__name__}, which holds them: give them in one place (the scheduler's, with no "
            f"{type(own).__name__} listed)."
        )
    return found


def warn_ignored(
    family: type[PredictionFamily], predictor: str, config: HybridConfig, monitor: Any, told: set[str]
) -> None:
    """Settings changed from their defaults that this mode does not read (and ``hybrid_callbacks`` has not already
    said so of): say so before training."""
    given = {
        "config": changed_from_default(config, list(ALL_PHASE_SETTINGS)),
        "monitor": changed_from_default(monitor, list(ALL_MONITOR_SETTINGS)),
    }
    names = [n for n in ignored(family, given) if n not in told]
    if names:
        rank_zero_warn(ignored_message(family, predictor, names))


def warn_short_fit(
    family: type[PredictionFamily], config: HybridConfig, predictor: Any, start: int, end: int | None, afresh: bool
) -> None:
    """A fit that ends before its mode can have made and judged a prediction trains as plain Lightning: say so
    before it trains (a ``max_steps`` below ``warmup_steps``, say). ``afresh``: the plugin starts at ``start`` with
    no state of its own (a plain run's checkpoint resumed), so its warm-up counts from there, and that is said."""
    first = (start if afresh else 0) + family.first_judged_step(config, predictor)
    if afresh:
        rank_zero_info(
            f"hybrid: this fit resumes at step {start} from a checkpoint without the plugin's state (a plain run's): "
            f"the plugin starts there, its warm-up (warmup_steps={config.warmup_steps}) counted from step {start}; "
            f"its first prediction can be made and judged by step {first}"
            + ("." if end is None else f", and this fit ends at step {end}.")
        )
    if end is None or end >= first or start >= first or not config.enable_prediction:
        return
    rank_zero_warn(
        f"hybrid: this fit ends at step {end}, before step {first}, the first by which {mode_of(family)} can have "
        f"made and judged a prediction (warmup_steps={config.warmup_steps}, full_steps={config.full_steps}"
        + (f", counted from step {start}" if afresh else "")
        + "): the whole fit is plain training with the plugin's checks. Lower warmup_steps or train longer."
    )


def used_corrector(
    trainer: pl.Trainer, scheduler: pl.Callback, family: type[PredictionFamily], predictor: str, own: Any
) -> Any:
    """The residual correction of the run's :class:`ResidualCorrector` where the mode uses one (the scheduler's
    ``own``, or one built with its defaults, when none is listed), else ``None``: one listed for a mode that does
    not use it is left out, with a warning."""
    uses = family.uses_corrector
    build = (lambda: own) if own is not None else ResidualCorrector
    corrector = find_component(trainer, scheduler, ResidualCorrector, build if uses else None, notice=own is None)
    if corrector is not None and not uses:
        rank_zero_warn(
            f"hybrid: the ResidualCorrector is a component of the per-step mode; predictor={predictor!r} runs the "
            f"{family.mode} mode, which does not use it"
        )
    return corrector.correction if corrector is not None and uses else None
