"""Which component owns each setting and which mode reads it, and the messages that point a misplaced, misspelt or
ignored setting to its place. ``hybrid_callbacks``, the ``HybridScheduler`` and the training app all give settings to
their owners through here, so every surface answers alike. (Steps are routed elsewhere: ``step_routing``.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_hybrid.algorithms import DivergenceCheck, LinUCBHorizons, ResidualCorrection
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.encoder import Encoding
from lightning_hybrid.engine import FAMILIES, PredictionFamily, family_of
from lightning_hybrid.predictors import PREDICTORS, OuterMomentum, Predictor, TrajectoryRule
from lightning_hybrid.settings import check_choice, declared, did_you_mean, setting_names, settings_dict

# Which component owns which setting of `hybrid_callbacks`: each is declared once, a field of its owner's dataclass
# (a named predictor's own settings are its class's). The callbacks that host the plain algorithm objects pass
# their settings on, so the objects are the owners.
SETTING_OWNERS: dict[str, Any] = {
    "config": HybridConfig,
    "monitor": DivergenceCheck,
    "corrector": ResidualCorrection,
    "bandit": LinUCBHorizons,
    "host": Encoding,
}
DEFAULT_RULE = OuterMomentum.name


def owned_settings() -> dict[str, list[str]]:
    """Each owner's settings (a named predictor's are its class's: :func:`predictor_settings`)."""
    return {owner: setting_names(cls) for owner, cls in SETTING_OWNERS.items()}


def predictor_settings(name: str) -> list[str]:
    return setting_names(PREDICTORS[name])


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


def changed_from_default(component: Any) -> dict[str, Any]:
    """The settings of ``component`` whose values differ from their defaults: what was set, as far as an already
    built component can tell."""
    return {
        s.name: getattr(component, s.name) for s in declared(type(component)) if getattr(component, s.name) != s.default
    }


# The keywords HybridScheduler takes, from the declarations of their owners, so that LightningCLI (jsonargparse reads
# ``**settings: Unpack[...]``) accepts exactly these under its ``init_args``.
SchedulerSettings = settings_dict("SchedulerSettings", *SETTING_OWNERS.values(), *PREDICTORS.values())


@dataclass
class ByOwner:
    """One call's settings, each given to the component that owns it (``predictor``: the named predictor's own),
    and those the chosen mode does not read (checked by their owners, warned about)."""

    family: type[PredictionFamily]
    owners: dict[str, dict[str, Any]]
    unread: list[str]


def by_owner(caller: str, predictor: str | Any, settings: dict[str, Any]) -> ByOwner:
    """Give ``settings`` to their owners for a run of ``predictor`` (a registered name or an instance). An
    unknown name raises ``TypeError`` with the closest known ones; another predictor's setting is checked by that
    predictor (a bad value fails as it would there) and counted as unread."""
    named = isinstance(predictor, str)
    if named:
        check_choice(caller, "predictor", predictor, PREDICTORS)
    elif not isinstance(predictor, (Predictor, TrajectoryRule)):
        raise TypeError(_not_a_predictor(caller, predictor))
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
    return ByOwner(family, owners, unread)


def _not_a_predictor(caller: str, predictor: Any) -> str:
    said = f"{caller}: `predictor` must be a registered name ({', '.join(PREDICTORS)}) or a Predictor or "
    said += f"TrajectoryRule instance, got a {type(predictor).__name__}"
    if isinstance(predictor, Mapping):  # what Hydra makes of a dataclass passed to instantiate() as a keyword
        said += (
            ": a config where an object was expected. Hydra turns an object passed to instantiate() as a keyword "
            "argument into a config when it is a dataclass, as the predictors are: give the predictor's config "
            "(with its _target_) under `predictor` instead, and Hydra builds it"
        )
    return said


def _unknown(caller: str, name: str, predictor: str | Any, known: dict[str, list[str]]) -> str:
    """The message for a setting no component of this call owns: where it belongs, if anywhere."""
    if not isinstance(predictor, str) and name in setting_names(type(predictor)):
        kind = type(predictor).__name__
        return f"{caller}: `{name}` is a setting of {kind}; with an instance, set it there: {kind}({name}=...)"
    accepted = ["predictor", "bandit", *(n for names in known.values() for n in names)]
    return unknown_setting(caller, name, accepted)


def short_fit(
    family: type[PredictionFamily], config: HybridConfig, predictor: Any, start: int, end: int | None, afresh: bool
) -> tuple[str | None, str | None]:
    """What to say before a run that ends before its mode can have made and judged a prediction (it trains plainly:
    a ``max_steps`` below ``warmup_steps``, say), and, where the plugin starts at ``start`` with no state of its own
    (``afresh``: a plain run's checkpoint resumed), that its warm-up counts from there: ``(info, warning)``."""
    first = (start if afresh else 0) + family.first_judged_step(config, predictor)
    resumed = None
    if afresh:
        resumed = (
            f"hybrid: this fit resumes at step {start} from a checkpoint without the plugin's state (a plain run's): "
            f"the plugin starts there, its warm-up (warmup_steps={config.warmup_steps}) counted from step {start}; "
            f"its first prediction can be made and judged by step {first}"
            + ("." if end is None else f", and this fit ends at step {end}.")
        )
    if end is None or end >= first or start >= first or not config.enable_prediction:
        return resumed, None
    return resumed, (
        f"hybrid: this fit ends at step {end}, before step {first}, the first by which {mode_of(family)} can have "
        f"made and judged a prediction (warmup_steps={config.warmup_steps}, full_steps={config.full_steps}"
        + (f", counted from step {start}" if afresh else "")
        + "): the whole fit is plain training with the plugin's checks. Lower warmup_steps or train longer."
    )
