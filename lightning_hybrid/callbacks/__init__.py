"""The hybrid callbacks and :func:`hybrid_callbacks`, which builds the default set."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.checkpoint_flag import is_unverified_checkpoint
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.memory import VRAMLogger
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.progress import HybridProgressBar
from lightning_hybrid.callbacks.routing import (
    SETTING_OWNERS,
    ignored,
    ignored_message,
    owned_settings,
    predictor_settings,
    unknown_setting,
)
from lightning_hybrid.callbacks.scheduler import HybridScheduler, find_scheduler
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import family_of
from lightning_hybrid.predictors import PREDICTORS, AnyPredictor, Predictor, TrajectoryRule
from lightning_hybrid.settings import settings_of_chain
from lightning_hybrid.validation import check_choice, check_optional_bool


def hybrid_callbacks(
    predictor: str | AnyPredictor = "outer", bandit: bool | None = None, **settings: Any
) -> list[Callback]:
    """The callbacks hybrid training needs, with settings applied.

    ``predictor`` is a registered name or a :class:`Predictor` or :class:`TrajectoryRule` instance: ``outer``
    (the default) keeps every backward pass and jumps along the weights' trajectory once a cycle, with the guards
    the learning-rate harness measured; ``linear``, ``mlp`` and ``rssm`` predict per step and skip backward passes
    (``docs/performance.md`` says what each measured). ``bandit``: whether to add the :class:`HorizonBandit`;
    ``None`` (the default) adds it for per-step predictors and leaves it out for trajectory rules, which make no
    Predict segments to choose horizons for. Every other keyword goes to the component that owns a setting of that
    name, with that component's default when not given: :class:`HybridConfig` (the phase settings),
    :class:`DivergenceMonitor`, :class:`ResidualCorrector`, :class:`HorizonBandit`, :class:`DynamicsPredictor`
    (``feature_dim``), or the named predictor (e.g. ``outer_lr`` of ``outer``, ``decay`` of ``linear``). An
    unknown name raises ``TypeError`` with the closest known ones; a setting the chosen mode does not read (a
    per-step setting under ``outer``, another predictor's ``decay``) is checked by its owner and warned about,
    once. The per-step mode's components (the corrector, the bandit) are listed only for the per-step predictors.
    """
    check_optional_bool("hybrid_callbacks", "bandit", bandit)
    named = not isinstance(predictor, (Predictor, TrajectoryRule))
    if named:
        check_choice("hybrid_callbacks", "predictor", predictor, PREDICTORS)
    family = family_of(PREDICTORS[predictor] if named else predictor)
    bandit = family.chooses_horizons if bandit is None else bandit
    known = owned_settings()
    known["predictor"] = predictor_settings(predictor) if named else []
    owners: dict[str, dict[str, Any]] = {owner: {} for owner in known}
    elsewhere: dict[str, dict[str, Any]] = {}  # another predictor's settings, by that predictor: checked, not read
    for name, value in settings.items():
        matches = [o for o, names in known.items() if name in names]
        other = next((p for p in PREDICTORS if named and name in predictor_settings(p)), None)
        if not matches and other is not None:
            elsewhere.setdefault(other, {})[name] = value
            continue
        if not matches:
            raise TypeError(_unknown(name, predictor, known))
        if len(matches) > 1:
            raise TypeError(
                f"hybrid_callbacks: setting `{name}` is ambiguous ({matches}); build those callbacks directly"
            )
        owners[matches[0]][name] = value
    callbacks: list[Callback] = [
        HybridScheduler(HybridConfig(**owners["config"])),
        DynamicsPredictor(predictor, predictor_kwargs=owners["predictor"], **owners["host"]),
        DivergenceMonitor(**owners["monitor"]),
    ]
    corrector = ResidualCorrector(**owners["corrector"])  # built either way: its settings are checked either way
    horizon_bandit = HorizonBandit(**owners["bandit"])
    for other, given in elsewhere.items():  # a bad value fails as it would with that predictor
        PREDICTORS[other](**given)
    given = {o: v for o, v in owners.items() if o != "predictor"}
    unread = ignored(family, given) + [name for named in elsewhere.values() for name in named]
    if unread:
        rank_zero_warn(ignored_message(family, callbacks[1].name, unread))
        callbacks[0].told_ignored = set(unread)  # said once: the scheduler does not say it again before training
    if family.uses_corrector:
        callbacks.append(corrector)
    return [*callbacks, horizon_bandit] if bandit else callbacks


def _unknown(name: str, predictor: str | AnyPredictor, known: dict[str, list[str]]) -> str:
    """The message for a setting no component of this call owns: where it belongs, if anywhere."""
    if not isinstance(predictor, str) and name in settings_of_chain(type(predictor)):
        kind = type(predictor).__name__
        return f"hybrid_callbacks: `{name}` is a setting of {kind}; with an instance, set it there: {kind}({name}=...)"
    accepted = ["bandit", *(n for names in known.values() for n in names)]
    return unknown_setting("hybrid_callbacks", name, accepted, predictor if isinstance(predictor, str) else None)


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
