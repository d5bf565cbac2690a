"""The app's settings in Hydra: the structured configs of the ``hybrid`` and ``predictor`` groups, generated from the
settings' declarations, and the check of the command line's overrides before Hydra composes them.

Each schema lists exactly the declared settings, with their defaults and types, so a value of the wrong type fails
when Hydra composes the config, before anything is built, and the schemas cannot drift from the code; the ranges are
checked by the owners, which raise ``ValueError``. An override is checked first: a key in the wrong group
(``hybrid.outer_lr``, a setting of the ``predictor`` group) is refused naming where it belongs, and a misspelt one
(``hybrid.ful_steps``) names the closest keys, where Hydra would say only that the key is not in the schema (and
suggest appending it with ``+``, which then fails further on); a config group's misspelt option (``predictor=mpl``)
names the group's options and the closest, where Hydra lists its structured schemas among them. A ``trainer.`` key
that is no argument of Lightning's ``Trainer`` (``trainer.max_step``) names the closest ones, where Hydra's advice
(``+trainer.max_step``) would fail in ``Trainer.__init__``.
"""

from __future__ import annotations

import copy
import inspect
import types
import typing
from collections.abc import Sequence
from dataclasses import field, fields, make_dataclass
from importlib.resources import files
from itertools import pairwise
from pathlib import Path
from typing import Any

import hydra.utils
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from lightning.pytorch import Trainer
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_hybrid.callbacks import SETTING_OWNERS, hybrid_callbacks
from lightning_hybrid.engine import family_of
from lightning_hybrid.predictors import PREDICTORS
from lightning_hybrid.setting_owners import owned_settings, reads
from lightning_hybrid.settings import declared, did_you_mean

_SIMPLE = (int, float, bool, str)
CONFIG_MODULE = "lightning_hybrid.configs"  # where the app's config groups ship
GROUPS = ("hybrid", "predictor")
TRAINER_ARGUMENTS = sorted(set(inspect.signature(Trainer.__init__).parameters) - {"self"})


# -- the schemas -------------------------------------------------------------------------------------------------
def _config_type(hint: Any) -> Any:
    """The closest type OmegaConf can check: simple types as they are, ``X | None`` as ``Optional[X]``,
    sequences of simple types as ``list``, anything else unchecked."""
    if hint in _SIMPLE:
        return hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in _SIMPLE:
            return typing.Optional[rest[0]]  # noqa: UP045 - OmegaConf does not read `X | None`
    if origin in (list, tuple, Sequence) and args and args[0] in _SIMPLE:
        return list[args[0]]
    return Any


def _arguments(cls: type) -> list[tuple[str, Any, Any]]:
    """``(name, config type, default)`` of every setting ``cls`` declares."""
    return [
        (s.name, _config_type(s.hint), list(s.default) if isinstance(s.default, tuple) else s.default)
        for s in declared(cls)
    ]


def _schema(name: str, target: str, arguments: list[tuple[str, Any, Any]]) -> type:
    specs: list[tuple[str, Any, Any]] = [("_target_", str, field(default=target))]
    for arg, hint, default in arguments:
        make = (lambda value=default: list(value)) if isinstance(default, list) else None
        specs.append((arg, hint, field(default_factory=make) if make else field(default=default)))
    return make_dataclass(name, specs)


def hybrid_arguments() -> list[tuple[str, Any, Any]]:
    """Every setting ``hybrid_callbacks`` accepts except the predictor's: ``bandit`` (its own argument), the phase
    settings and the settings of the engine's components."""
    bandit = inspect.signature(hybrid_callbacks).parameters["bandit"]
    explicit = [("bandit", typing.Optional[bool], bandit.default)]  # noqa: UP045 - OmegaConf does not read `X | None`
    return explicit + [arg for cls in SETTING_OWNERS.values() for arg in _arguments(cls)]


HybridSettings = _schema("HybridSettings", "lightning_hybrid.hybrid_callbacks", hybrid_arguments())


def changed_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Of a composed ``hybrid`` group's settings, those whose values differ from the schema's defaults: what a
    user set (the app's config holds every setting, each at its default where the user set none)."""
    defaults = {name: default for name, _, default in hybrid_arguments()}
    return {name: value for name, value in settings.items() if name not in defaults or value != defaults[name]}


def read_by_its_mode(cfg: DictConfig) -> DictConfig:
    """``cfg`` without the ``hybrid`` settings its predictor's mode does not read and the user left at their
    defaults: what the run's dumped ``config.yaml`` holds (every setting is in ``docs/settings.md``; one the user
    set stays, and was warned about)."""
    family = family_of(hydra.utils.get_class(cfg.predictor._target_))
    # `bandit` (whether to bring the horizon bandit) is read where the bandit's own settings are
    owners = {name: owner for owner, names in owned_settings().items() for name in names} | {"bandit": "bandit"}
    set_by_user = changed_settings(OmegaConf.to_container(cfg.hybrid))
    unread = [n for n in setting_names(HybridSettings) if n not in set_by_user and not reads(family, owners[n], n)]
    trimmed = copy.deepcopy(cfg)
    with open_dict(trimmed.hybrid):
        for name in unread:
            del trimmed.hybrid[name]
    return trimmed


PREDICTOR_SETTINGS = {
    name: _schema(f"{cls.__name__}Settings", f"{cls.__module__}.{cls.__qualname__}", _arguments(cls))
    for name, cls in PREDICTORS.items()
}


def share(total: int, parts: int) -> int | None:
    """``${share:total,parts}`` in the configs: ``total // parts``, at least 1; ``None`` when ``total`` is not a
    step count (``max_steps: -1`` trains by epochs)."""
    return max(1, int(total) // int(parts)) if int(total) > 0 else None


def register_configs() -> None:
    """Store the schemas where the YAML configs extend them: ``hybrid/hybrid_schema`` and
    ``predictor/<name>_schema``; register the ``share`` resolver."""
    OmegaConf.register_new_resolver("share", share, replace=True)
    store = ConfigStore.instance()
    store.store(group="hybrid", name="hybrid_schema", node=HybridSettings)
    for name, schema in PREDICTOR_SETTINGS.items():
        store.store(group="predictor", name=f"{name}_schema", node=schema)


def setting_names(schema: type) -> list[str]:
    return [f.name for f in fields(schema) if f.name != "_target_"]


# -- the command line's overrides -------------------------------------------------------------------------------
def _predictors_of(name: str) -> list[str]:
    return [p for p, schema in PREDICTOR_SETTINGS.items() if name in setting_names(schema)]


def _overrides_and_config_dirs(args: Sequence[str]) -> tuple[list[str], list[Path]]:
    """The command line's overrides (``key=value``, ``~key``) and the folders of its ``--config-dir``/``-cd``."""
    overrides = [a for a in args if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    dirs = [b for a, b in pairwise(args) if a in ("--config-dir", "-cd")]
    dirs += [a.split("=", 1)[1] for a in args if a.startswith("--config-dir=")]
    return overrides, [Path(d) for d in dirs]


def group_options(group: str, config_dirs: Sequence[Path] = ()) -> list[str] | None:
    """The configs a group of the app offers, shipped or in ``config_dirs``; ``None`` for a key that is no group."""
    shipped = files(CONFIG_MODULE) / group
    if not shipped.is_dir():
        return None
    found = [p.name for p in shipped.iterdir()] + [
        p.name for d in config_dirs if (d / group).is_dir() for p in (d / group).iterdir()
    ]
    return sorted({name.removesuffix(".yaml") for name in found if name.endswith(".yaml")})


def misplaced(args: Sequence[str]) -> str | None:
    """The message for the first override that sets a key the ``hybrid`` or ``predictor`` group does not have, or
    names an option no config group has or ``null`` (which Hydra refuses with a traceback: ``~group`` drops one),
    or ``None``. Overrides that do not parse are left to Hydra, which names them."""
    overrides, dirs = _overrides_and_config_dirs(args)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return None
    hybrid = setting_names(HybridSettings)
    predictor = sorted({n for schema in PREDICTOR_SETTINGS.values() for n in setting_names(schema)})
    own_trainer = any(o.key_or_group == "trainer._target_" for o in parsed)  # a Trainer of the user's: its arguments
    chosen = next((o.value() for o in parsed if o.key_or_group == "predictor" and isinstance(o.value(), str)), None)
    for override in parsed:
        value, name = override.value(), override.key_or_group.lstrip("+")
        options = None if "." in name or "/" in name or override.is_delete() else group_options(name, dirs)
        if options is not None and value is None:
            listed = ", ".join(options)
            return f"`{name}=null` picks no config: drop the {name} group with `~{name}`, or pick one of {listed}"
        if options is not None and isinstance(value, str) and value not in options:
            listed = ", ".join(options)
            return f"`{name}={value}` is no config of the {name} group: one of {listed}{did_you_mean(value, options)}"
        group, _, key = name.partition(".")
        if not key or "." in key or override.is_delete():
            continue
        if group == "trainer" and not own_trainer and key not in TRAINER_ARGUMENTS:
            closest = did_you_mean(key, TRAINER_ARGUMENTS, "trainer.")
            return f"`trainer.{key}` is no argument of Lightning's Trainer{closest}"
        if group not in GROUPS:
            continue
        if group == "hybrid" and key not in hybrid:
            owners = _predictors_of(key)
            if owners:
                which = chosen if chosen in owners else owners[0]
                pick = "" if which == "outer" else f" with predictor={which}"
                return f"`hybrid.{key}` is a setting of the predictor group: use predictor.{key}=...{pick}"
            return f"`hybrid.{key}` is not a setting{did_you_mean(key, hybrid, 'hybrid.')}"
        if group == "predictor" and key not in predictor:
            if key in hybrid:
                return f"`predictor.{key}` is a setting of the hybrid group: use hybrid.{key}=..."
            return f"`predictor.{key}` is not a setting of any predictor{did_you_mean(key, predictor, 'predictor.')}"
        if (
            group == "predictor"
            and chosen in PREDICTOR_SETTINGS
            and key not in setting_names(PREDICTOR_SETTINGS[chosen])
        ):
            return f"`predictor.{key}` is a setting of predictor={_predictors_of(key)[0]}, not of predictor={chosen}"
    return None
