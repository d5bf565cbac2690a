"""The hybrid callbacks and :func:`hybrid_callbacks`, which builds the default set."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.memory import VRAMLogger
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.progress import HybridProgressBar
from lightning_hybrid.callbacks.scheduler import HybridScheduler, find_scheduler
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.predictors import PREDICTORS, Predictor, init_chain
from lightning_hybrid.validation import check_choice

# The components whose settings ``hybrid_callbacks`` routes by name (the predictor's come from ``init_chain``).
SETTING_OWNERS: dict[str, type] = {
    "config": HybridConfig,
    "monitor": DivergenceMonitor,
    "corrector": ResidualCorrector,
    "bandit": HorizonBandit,
}
HOST_SETTINGS = ("feature_dim",)  # the DynamicsPredictor's own settings


def _settings_of(init: Callable[..., None]) -> set[str]:
    return {name for name in inspect.signature(init).parameters if name not in ("self", "args", "kwargs")}


def hybrid_callbacks(
    predictor: str | Predictor = "linear",
    warmup_steps: int = 100,
    full_steps: int = 20,
    max_predict_steps: int = 10,
    confidence_threshold: float = 0.5,
    predict_forward_every: int = 1,
    correction_steps: int = 5,
    bandit: bool = True,
    **more: Any,
) -> list[Callback]:
    """The callbacks hybrid training needs, with settings applied.

    ``predictor`` is a registered name or a :class:`Predictor` instance. The named arguments are the phase
    settings (see :class:`HybridConfig`); ``bandit=False`` leaves out the :class:`HorizonBandit` (its settings are
    then accepted and unused), and the horizon follows the scheduler's halve-on-failure rule. Any other keyword
    goes to the component that owns a setting of that name: :class:`HybridConfig`, :class:`DivergenceMonitor`,
    :class:`ResidualCorrector`, :class:`HorizonBandit`, :class:`DynamicsPredictor` (``feature_dim``), or a named
    predictor (e.g. ``decay`` of ``linear``). Unknown or ambiguous names raise ``TypeError``.
    """
    if not isinstance(predictor, Predictor):
        check_choice("hybrid_callbacks", "predictor", predictor, PREDICTORS)
    known = {owner: _settings_of(cls.__init__) for owner, cls in SETTING_OWNERS.items()}
    known["host"] = set(HOST_SETTINGS)
    chain = [] if isinstance(predictor, Predictor) else init_chain(PREDICTORS[predictor])
    known["predictor"] = set().union(*(_settings_of(init) for init in chain))
    owners: dict[str, dict[str, Any]] = {owner: {} for owner in known}
    for name, value in more.items():
        matches = [o for o, names in known.items() if name in names]
        if not matches:
            allowed = sorted(set().union(*known.values()))
            raise TypeError(f"hybrid_callbacks: unknown setting {name!r}; known settings: {', '.join(allowed)}")
        if len(matches) > 1:
            raise TypeError(
                f"hybrid_callbacks: setting {name!r} is ambiguous ({matches}); build those callbacks directly"
            )
        owners[matches[0]][name] = value
    config = HybridConfig(
        warmup_steps=warmup_steps,
        full_steps=full_steps,
        max_predict_steps=max_predict_steps,
        confidence_threshold=confidence_threshold,
        predict_forward_every=predict_forward_every,
        correction_steps=correction_steps,
        **owners["config"],
    )
    callbacks: list[Callback] = [
        HybridScheduler(config),
        DynamicsPredictor(predictor, predictor_kwargs=owners["predictor"], **owners["host"]),
        ResidualCorrector(**owners["corrector"]),
        DivergenceMonitor(**owners["monitor"]),
    ]
    if bandit:
        callbacks.append(HorizonBandit(**owners["bandit"]))
    return callbacks


__all__ = [
    "HOST_SETTINGS",
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
]
