"""The hybrid callbacks and :func:`hybrid_callbacks`, which builds the default set."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_hybrid.algorithms import DivergenceCheck, LinUCBHorizons, ResidualCorrection
from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.memory import VRAMLogger
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.progress import HybridProgressBar
from lightning_hybrid.callbacks.scheduler import HybridScheduler, find_scheduler, is_unverified_checkpoint
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import family_of
from lightning_hybrid.predictors import PREDICTORS, AnyPredictor, Predictor, TrajectoryRule, init_chain
from lightning_hybrid.validation import check_choice

# Which component owns which setting of `hybrid_callbacks`: each name appears once, with its default, in the
# owner's constructor (a named predictor's own settings come from its `init_chain`). The callbacks that host the
# plain algorithm objects pass their settings on, so the objects' constructors are the owners.
SETTING_OWNERS: dict[str, Callable[..., Any]] = {
    "config": HybridConfig,
    "monitor": DivergenceCheck,
    "corrector": ResidualCorrection,
    "bandit": LinUCBHorizons,
    "host": DynamicsPredictor,
}
NOT_SETTINGS = ("self", "args", "kwargs", "predictor", "predictor_kwargs")  # wiring, not settings


def settings_of(init: Callable[..., Any]) -> set[str]:
    return {name for name in inspect.signature(init).parameters if name not in NOT_SETTINGS}


def _unknown(name: str, predictor: str | AnyPredictor, known: dict[str, set[str]]) -> str:
    """The message for a setting no component of this call owns: where it belongs, if anywhere."""
    if not isinstance(predictor, str) and name in settings_of_chain(type(predictor)):
        kind = type(predictor).__name__
        return f"hybrid_callbacks: {name!r} is a setting of {kind}; with an instance, set it there: {kind}({name}=...)"
    owners = sorted(n for n, cls in PREDICTORS.items() if name in settings_of_chain(cls))
    if owners:
        return f"hybrid_callbacks: {name!r} is a setting of predictor={owners[0]!r}, not of predictor={predictor!r}"
    allowed = sorted({"bandit", *set().union(*known.values())})
    return f"hybrid_callbacks: unknown setting {name!r}; known settings: {', '.join(allowed)}"


def settings_of_chain(cls: type) -> set[str]:
    """A predictor class's settings: its own and those of the bases it forwards ``**kwargs`` to."""
    return set().union(*(settings_of(init) for init in init_chain(cls)))


def hybrid_callbacks(
    predictor: str | AnyPredictor = "outer", bandit: bool | None = None, **settings: Any
) -> list[Callback]:
    """The callbacks hybrid training needs, with settings applied.

    ``predictor`` is a registered name or a :class:`Predictor` or :class:`TrajectoryRule` instance: ``outer``
    (the default) keeps every backward pass and jumps along the weights' trajectory once a cycle, with the guards
    the learning-rate harness measured; ``linear``, ``mlp`` and ``rssm`` predict per step and skip backward passes
    (``docs/performance.md`` says what each measured). ``bandit``: whether to add the :class:`HorizonBandit`;
    ``None`` (the default) adds it for per-step predictors and leaves it out for trajectory rules, which make no
    Predict segments to choose horizons for. Left out, its settings are still checked, and the horizon follows the
    scheduler's halve-on-failure rule. Every other keyword goes to the component that owns a setting of that name,
    with that component's default when not given: :class:`HybridConfig` (the phase settings),
    :class:`DivergenceMonitor`, :class:`ResidualCorrector`, :class:`HorizonBandit`, :class:`DynamicsPredictor`
    (``feature_dim``), or the named predictor (e.g. ``outer_lr`` of ``outer``, ``decay`` of ``linear``). Unknown or
    ambiguous names raise ``TypeError``.
    """
    if bandit is not None and not isinstance(bandit, bool):
        raise ValueError(f"hybrid_callbacks: `bandit` must be True, False or None, got {bandit!r}")
    if not isinstance(predictor, (Predictor, TrajectoryRule)):
        check_choice("hybrid_callbacks", "predictor", predictor, PREDICTORS)
    if bandit is None:  # only a family that makes Predict segments has horizons for a bandit to choose
        kind = predictor if isinstance(predictor, (Predictor, TrajectoryRule)) else PREDICTORS[predictor]
        bandit = family_of(kind).chooses_horizons
    known = {owner: settings_of(cls.__init__) for owner, cls in SETTING_OWNERS.items()}
    named = not isinstance(predictor, (Predictor, TrajectoryRule))
    known["predictor"] = settings_of_chain(PREDICTORS[predictor]) if named else set()
    owners: dict[str, dict[str, Any]] = {owner: {} for owner in known}
    for name, value in settings.items():
        matches = [o for o, names in known.items() if name in names]
        if not matches:
            raise TypeError(_unknown(name, predictor, known))
        if len(matches) > 1:
            raise TypeError(
                f"hybrid_callbacks: setting {name!r} is ambiguous ({matches}); build those callbacks directly"
            )
        owners[matches[0]][name] = value
    callbacks: list[Callback] = [
        HybridScheduler(HybridConfig(**owners["config"])),
        DynamicsPredictor(predictor, predictor_kwargs=owners["predictor"], **owners["host"]),
        ResidualCorrector(**owners["corrector"]),
        DivergenceMonitor(**owners["monitor"]),
    ]
    horizon_bandit = HorizonBandit(**owners["bandit"])  # built either way: its settings are checked either way
    return [*callbacks, horizon_bandit] if bandit else callbacks


__all__ = [
    "SETTING_OWNERS",
    "DivergenceMonitor",
    "DynamicsPredictor",
    "HorizonBandit",
    "HybridComponent",
    "HybridProgressBar",
    "HybridScheduler",
    "ResidualCorrector",
    "VRAMLogger",
    "find_scheduler",
    "hybrid_callbacks",
    "is_unverified_checkpoint",
]
