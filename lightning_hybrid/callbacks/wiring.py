"""What the ``HybridScheduler`` checks and finds in a Trainer before training starts, reading it only: its component
callbacks, the strategy it runs beside, the gradients the engine can read, the step at which training will end, and
what it warns about (settings the mode does not read, a fit too short for any prediction, a loader the ranks cannot
share exactly)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn

from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import PredictionFamily
from lightning_hybrid.engine.store import refuse_sparse
from lightning_hybrid.lightning_packages import MisconfigurationException, classes, module
from lightning_hybrid.samplers import one_permutation
from lightning_hybrid.setting_owners import changed_from_default, ignored, ignored_message, short_fit
from lightning_hybrid.step_routing import StepRouting

# strategies the plugin cannot serve, and why (said at setup, before training)
REFUSED = {
    "DeepSpeedStrategy": "DeepSpeed's engine owns the optimizer step and the gradients, which the plugin must guard",
    "FSDPStrategy": (
        "the plugin's state is per shard, and FSDPStrategy's checkpoints hold rank 0's callbacks only: a resume "
        "would give every rank rank 0's shards. Shard with FSDP2: ModelParallelStrategy, or strategy='hybrid_fsdp'"
    ),
}


def find_component(trainer: Any, kind: type) -> Any:
    """The component of ``kind`` the user listed among the Trainer's callbacks, or ``None``; two are refused."""
    matches = [cb for cb in trainer.callbacks if isinstance(cb, kind)]
    if len(matches) > 1:
        present = sorted(type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, HybridComponent))
        raise MisconfigurationException(
            f"HybridScheduler takes at most one {kind.__name__} callback, found {len(matches)} "
            f"(hybrid callbacks present: {present})."
        )
    return matches[0] if matches else None


def check_strategy(strategy: Any, per_step: str | None) -> bool:
    """Refuse, by name, a strategy the plugin cannot serve, and the per-step mode (``per_step``: its predictor's
    name) beside any but a hybrid strategy, which owns a predicted step's dispatch. Returns whether the strategy
    holds the parameters as shards (FSDP2's ``ModelParallelStrategy``)."""
    name = type(strategy).__name__
    if per_step is not None and not isinstance(strategy, StepRouting):
        raise MisconfigurationException(
            f"predictor={per_step!r} runs the per-step mode, which predicts whole steps and owns their dispatch: it "
            f"needs a hybrid strategy, not {name}. Pass strategy='hybrid' (one device), 'hybrid_ddp' or "
            "'hybrid_fsdp' to a Trainer of lightning.pytorch (`import lightning as L`), whose strategies they are; "
            "the default rule and 'gpa' run beside any strategy, in either Lightning package."
        )
    for refused, why in REFUSED.items():
        if isinstance(strategy, classes("pytorch.strategies", refused)):
            raise MisconfigurationException(f"The hybrid plugin cannot run beside {name}: {why}.")
    sharded = isinstance(strategy, classes("pytorch.strategies", "ModelParallelStrategy"))
    if sharded and not strategy._save_distributed_checkpoint:
        raise MisconfigurationException(
            f"The hybrid plugin cannot run beside {name}(save_distributed_checkpoint=False): its state is per shard, "
            "saved per rank inside a sharded checkpoint; keep save_distributed_checkpoint=True."
        )
    return sharded


def what_it_goes_without(trainer: Any) -> str | None:
    """The one thing a fit on several ranks beside Lightning's own strategy goes without, where it has it: a shuffled
    ``StatefulDataLoader`` keeps Lightning's sampler wrapper (:mod:`~lightning_hybrid.samplers`)."""
    if trainer.world_size == 1 or isinstance(trainer.strategy, StepRouting):
        return None
    loaders = module("pytorch.utilities.combined_loader").CombinedLoader(trainer.train_dataloader).flattened
    if all(one_permutation(loader) is loader for loader in loaders):
        return None
    return (
        f"hybrid: beside {type(trainer.strategy).__name__}, the shuffled StatefulDataLoader keeps Lightning's sampler "
        "wrapper, whose ranks draw their own orders (shards can overlap, a mid-epoch resume draws anew); "
        "strategy='hybrid_ddp' or 'hybrid_fsdp' gives it one permutation, sharded, that resumes exactly."
    )


def refuse_optimizers(optimizers: list[Any], family: type[PredictionFamily], predictor: str) -> None:
    """The per-step mode trains one optimizer; several that step on one loss are one trajectory to the others."""
    if len(optimizers) > 1 and family.predicts_steps:
        raise MisconfigurationException(
            f"predictor={predictor!r} runs the per-step mode, which trains one optimizer (several param groups are "
            f"fine); `configure_optimizers` returned {len(optimizers)}. Several optimizers that step on one loss "
            "train under the default rule, predictor='outer'."
        )


def refuse_sparse_gradients(module: Any) -> None:
    try:
        refuse_sparse(module)
    except ValueError as err:
        raise MisconfigurationException(str(err)) from err


def refuse_untrainable(module: Any) -> None:
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(
            f"{type(module).__name__} has no trainable parameters (none with requires_grad=True); "
            "hybrid training needs at least one."
        )


def fit_runs(state: Any, engine: Any) -> Callable[[], bool]:
    """Whether the fit started now still runs (its status the one it has now, compared by identity: Lightning's
    enums compare strings, lowercased, twice a step) with the engine bound: when the step hooks act."""
    return partial(_still_running, state, state.status, engine)


def _still_running(state: Any, running: Any, engine: Any) -> bool:
    return state.status is running and engine.bound


def last_step(trainer: Any) -> int | None:
    """The global step at which ``fit`` will end, from ``max_steps`` or the epochs; ``None`` where it is open."""
    total = trainer.estimated_stepping_batches
    return int(total) if math.isfinite(total) else None


def find_own(trainer: Any, own: Any, given: list[str] | None) -> Any:
    """The listed component of ``own``'s kind, or the scheduler's ``own``. Settings given to the scheduler for that
    component while another of its kind is listed are refused: which would win is not the plugin's to guess."""
    found = find_component(trainer, type(own))
    if found is not None and found is not own and given:
        raise MisconfigurationException(
            f"HybridScheduler was given {given}, settings of its {type(own).__name__}, but the Trainer also lists a "
            f"{type(own).__name__}, which holds them: give them in one place (the scheduler's, with no "
            f"{type(own).__name__} listed)."
        )
    return found if found is not None else own


def warn_ignored(
    family: type[PredictionFamily], predictor: str, config: HybridConfig, monitor: Any, told: set[str]
) -> None:
    """Settings changed from their defaults that this mode does not read (and ``hybrid_callbacks`` has not already
    said so of): say so before training."""
    given = {
        "config": changed_from_default(config),
        "monitor": changed_from_default(monitor),
    }
    names = [n for n in ignored(family, given) if n not in told]
    if names:
        rank_zero_warn(ignored_message(family, predictor, names))


def warn_short_fit(
    family: type[PredictionFamily], config: HybridConfig, predictor: Any, start: int, end: int | None, afresh: bool
) -> None:
    resumed, short = short_fit(family, config, predictor, start, end, afresh)
    if resumed:
        rank_zero_info(resumed)
    if short:
        rank_zero_warn(short)


def used_corrector(trainer: Any, family: type[PredictionFamily], predictor: str, own: Any) -> Any:
    """The run's :class:`ResidualCorrector` where the mode uses one: the listed one, else the scheduler's ``own``
    (one built with its defaults, said, where it brought none); ``None`` where the mode uses none, and one listed
    for such a mode is left out, with a warning."""
    listed = find_component(trainer, ResidualCorrector)
    if not family.uses_corrector:
        if listed is not None:
            rank_zero_warn(
                f"hybrid: the ResidualCorrector is a component of the per-step mode; predictor={predictor!r} runs "
                f"the {family.mode} mode, which does not use it"
            )
        return None
    if listed is None and own is None:
        rank_zero_info("hybrid: no ResidualCorrector among the callbacks; using one with its default settings")
        return ResidualCorrector()
    return listed if listed is not None else own
