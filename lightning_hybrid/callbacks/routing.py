"""Where each setting belongs: which component owns it, which mode reads it, and the messages that point a
misplaced, misspelt or ignored setting to its place. ``hybrid_callbacks``, the ``HybridScheduler`` and the training
app all route through here, so every surface answers alike."""

from __future__ import annotations

import typing
from typing import Any

from typing_extensions import TypedDict

from lightning_hybrid.algorithms import DivergenceCheck, LinUCBHorizons, ResidualCorrection
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import FAMILIES, PredictionFamily
from lightning_hybrid.predictors import PREDICTORS, OuterMomentum
from lightning_hybrid.settings import did_you_mean, settings_of, settings_of_chain

# Which component owns which setting of `hybrid_callbacks`: each name appears once, with its default, in the
# owner's constructor (a named predictor's own settings come from its class). The callbacks that host the plain
# algorithm objects pass their settings on, so the objects' constructors are the owners.
SETTING_OWNERS: dict[str, Any] = {
    "config": HybridConfig,
    "monitor": DivergenceCheck,
    "corrector": ResidualCorrection,
    "bandit": LinUCBHorizons,
    "host": DynamicsPredictor,
}
# Where a user sets each owner's settings by hand (the message for a setting given in the wrong place).
PLACES = {
    "config": "HybridScheduler",
    "monitor": "DivergenceMonitor",
    "corrector": "ResidualCorrector",
    "bandit": "HorizonBandit",
    "host": "DynamicsPredictor",
}
DEFAULT_RULE = OuterMomentum.name


def owned_settings() -> dict[str, list[str]]:
    """Each owner's settings; a predictor's are its class's (``settings_of_chain``)."""
    return {owner: settings_of(cls.__init__) for owner, cls in SETTING_OWNERS.items()}


def predictor_settings(name: str) -> list[str]:
    return settings_of_chain(PREDICTORS[name])


def unknown_setting(caller: str, name: str, accepted: list[str], predictor: str | None) -> str:
    """The message for a setting ``caller`` does not take: where it belongs, or the closest names it does take."""
    owners = [PLACES[o] for o in _owners_of(name)]
    rules = [p for p in PREDICTORS if name in predictor_settings(p)]
    if rules and predictor is not None and predictor not in rules:
        return f"{caller}: `{name}` is a setting of predictor={rules[0]!r}, not of predictor={predictor!r}"
    if rules:
        return f"{caller}: `{name}` is a setting of predictor={rules[0]!r}; give it with that predictor's settings"
    if owners:
        return f"{caller}: `{name}` is a setting of {owners[0]}; set it there ({owners[0]}({name}=...))"
    hint = did_you_mean(name, accepted) or "; every setting is listed in docs/settings.md"
    return f"{caller}: unknown setting `{name}`{hint}"


# -- which mode reads which setting ------------------------------------------------------------------------------
def reads(family: type[PredictionFamily], owner: str, name: str) -> bool:
    """Whether a run of ``family`` reads the setting ``name`` of ``owner``."""
    if owner == "config":
        return name in family.phase_settings
    if owner == "monitor":
        return name in family.monitor_settings
    if owner in ("corrector", "host"):  # the corrector and the state encoder it works on
        return family.uses_corrector
    if owner == "bandit":
        return family.chooses_horizons
    return True


def mode_of(family: type[PredictionFamily]) -> str:
    """``the per-step mode (predictor='linear', 'mlp' or 'rssm')``: a family's mode and the predictors it runs."""
    names = [repr(n) for n, cls in PREDICTORS.items() if cls.family == family.name]
    listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    return f"the {family.mode} mode (predictor={listed})"


def ignored_message(family: type[PredictionFamily], predictor: str, names: list[str]) -> str:
    """The warning for settings a run of ``family`` does not read: the mode each belongs to."""
    others = [f for f in FAMILIES.values() if f is not family]
    belongs = {n: next((mode_of(f) for f in others if _reads_setting(f, n)), None) for n in names}
    parts = []
    for mode in dict.fromkeys(belongs.values()):
        listed = ", ".join(f"`{n}`" for n, m in belongs.items() if m == mode)
        parts.append(f"{listed} {'belong' if ',' in listed else 'belongs'} to {mode or 'no mode of this run'}")
    them = "them" if len(names) > 1 else "it"
    return (
        f"hybrid: {'; '.join(parts)}; predictor={predictor!r} runs the {family.mode} mode, which does not read {them}"
    )


def _reads_setting(family: type[PredictionFamily], name: str) -> bool:
    """Whether a run of ``family`` reads the setting ``name``: a component's, or one of its predictors' own."""
    rules = [p for p, cls in PREDICTORS.items() if cls.family == family.name and name in predictor_settings(p)]
    return bool(rules) or any(reads(family, owner, name) for owner in _owners_of(name))


def _owners_of(name: str) -> list[str]:
    return [owner for owner, names in owned_settings().items() if name in names]


def ignored(family: type[PredictionFamily], given: dict[str, dict[str, Any]]) -> list[str]:
    """The settings in ``given`` (by owner) that a run of ``family`` does not read."""
    return [name for owner, named in given.items() for name in named if not reads(family, owner, name)]


def changed_from_default(component: Any, names: list[str]) -> dict[str, Any]:
    """The settings of ``component`` among ``names`` whose values differ from its constructor's defaults: what was
    set, as far as an already built component can tell."""
    fresh = type(component)()
    return {n: getattr(component, n) for n in names if getattr(component, n) != getattr(fresh, n)}


def _hints(init: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(init)
    hints.pop("return", None)
    return hints


PHASE_SETTINGS = _hints(HybridConfig)
RULE_SETTINGS = {n: t for n, t in _hints(OuterMomentum.__init__).items() if n in predictor_settings(DEFAULT_RULE)}
# The keywords HybridScheduler takes, generated from the constructors that own them, so that LightningCLI
# (jsonargparse reads ``**settings: Unpack[...]``) accepts exactly these under its ``init_args``.
SchedulerSettings = TypedDict("SchedulerSettings", {**PHASE_SETTINGS, **RULE_SETTINGS}, total=False)


def split_scheduler_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``HybridScheduler``'s keywords as (phase settings, the default rule's settings); any other is refused,
    pointing to where it belongs."""
    accepted = [*PHASE_SETTINGS, *RULE_SETTINGS]
    for name in settings:
        if name not in accepted:
            raise TypeError(unknown_setting("HybridScheduler", name, accepted, DEFAULT_RULE))
    phase = {n: v for n, v in settings.items() if n in PHASE_SETTINGS}
    return phase, {n: v for n, v in settings.items() if n in RULE_SETTINGS}
