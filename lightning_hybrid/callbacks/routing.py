"""Where each setting belongs: which component owns it, which mode reads it, and the messages that point a
misplaced, misspelt or ignored setting to its place. ``hybrid_callbacks``, the ``HybridScheduler`` and the training
app all route through here, so every surface answers alike."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from typing_extensions import TypedDict

from lightning_hybrid.algorithms import DivergenceCheck, LinUCBHorizons, ResidualCorrection
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import FAMILIES, PredictionFamily, family_of
from lightning_hybrid.predictors import PREDICTORS, OuterMomentum
from lightning_hybrid.settings import did_you_mean, init_chain, settings_of, settings_of_chain
from lightning_hybrid.validation import check_choice

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
DEFAULT_RULE = OuterMomentum.name


def owned_settings() -> dict[str, list[str]]:
    """Each owner's settings; a predictor's are its class's (``settings_of_chain``)."""
    return {owner: settings_of(cls.__init__) for owner, cls in SETTING_OWNERS.items()}


def predictor_settings(name: str) -> list[str]:
    return settings_of_chain(PREDICTORS[name])


def unknown_setting(caller: str, name: str, accepted: list[str]) -> str:
    """The message for a setting ``caller`` does not take: the predictor it belongs to, or the closest names it
    does take."""
    rules = [p for p in PREDICTORS if name in predictor_settings(p)]
    if rules:
        return f"{caller}: `{name}` is a setting of predictor={rules[0]!r}; give it with that predictor's settings"
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
    return {name: hint for name, hint in hints.items() if name in settings_of(init)}


def _every_setting() -> dict[str, Any]:
    """Every setting ``HybridScheduler`` takes, with its type: the components' and every predictor's."""
    hints: dict[str, Any] = {}
    for cls in [*SETTING_OWNERS.values(), *PREDICTORS.values()]:
        for init in reversed(init_chain(cls)):
            hints |= _hints(init)
    return hints


# The keywords HybridScheduler takes, generated from the constructors that own them, so that LightningCLI
# (jsonargparse reads ``**settings: Unpack[...]``) accepts exactly these under its ``init_args``.
SchedulerSettings = TypedDict("SchedulerSettings", _every_setting(), total=False)


@dataclass
class Routed:
    """One call's settings, each given to the component that owns it (``predictor``: the named predictor's own),
    and those the chosen mode does not read (checked by their owners, warned about)."""

    family: type[PredictionFamily]
    owners: dict[str, dict[str, Any]]
    unread: list[str]


def route(caller: str, predictor: str | Any, settings: dict[str, Any]) -> Routed:
    """Route ``settings`` to their owners for a run of ``predictor`` (a registered name or an instance). An
    unknown name raises ``TypeError`` with the closest known ones; another predictor's setting is checked by that
    predictor (a bad value fails as it would there) and counted as unread."""
    named = isinstance(predictor, str)
    if named:
        check_choice(caller, "predictor", predictor, PREDICTORS)
    family = family_of(PREDICTORS[predictor] if named else predictor)
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
            raise TypeError(_unknown(caller, name, predictor, known))
        if len(matches) > 1:
            raise TypeError(f"{caller}: setting `{name}` is ambiguous ({matches}); build those callbacks directly")
        owners[matches[0]][name] = value
    for other, given in elsewhere.items():  # a bad value fails as it would with that predictor
        PREDICTORS[other](**given)
    given = {o: v for o, v in owners.items() if o != "predictor"}
    unread = ignored(family, given) + [name for named in elsewhere.values() for name in named]
    return Routed(family, owners, unread)


def _unknown(caller: str, name: str, predictor: str | Any, known: dict[str, list[str]]) -> str:
    """The message for a setting no component of this call owns: where it belongs, if anywhere."""
    if not isinstance(predictor, str) and name in settings_of_chain(type(predictor)):
        kind = type(predictor).__name__
        return f"{caller}: `{name}` is a setting of {kind}; with an instance, set it there: {kind}({name}=...)"
    accepted = ["predictor", "bandit", *(n for names in known.values() for n in names)]
    return unknown_setting(caller, name, accepted)
