"""Structured configs for the Hydra app, generated from the constructors they configure.

Each dataclass lists exactly the documented constructor arguments, with the same defaults and types, so a
misspelt key or a value of the wrong type fails when Hydra composes the config, before anything is built, and the
schemas cannot drift from the code. Range checks stay with the components, which raise ``ValueError``.
"""

from __future__ import annotations

import copy
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import field, fields, make_dataclass
from typing import Any

import hydra.utils
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_hybrid.callbacks import SETTING_OWNERS, hybrid_callbacks
from lightning_hybrid.predictors import PREDICTORS
from lightning_hybrid.settings import init_chain, settings_of

_SIMPLE = (int, float, bool, str)


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


def _arguments(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """``(name, config type, default)`` of every argument of ``fn`` that has a default."""
    hints = typing.get_type_hints(fn)
    out = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.default is inspect.Parameter.empty or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        default = list(param.default) if isinstance(param.default, tuple) else param.default
        out.append((name, _config_type(hints.get(name, Any)), default))
    return out


def _schema(name: str, target: str, arguments: list[tuple[str, Any, Any]]) -> type:
    specs: list[tuple[str, Any, Any]] = [("_target_", str, field(default=target))]
    for arg, hint, default in arguments:
        make = (lambda value=default: list(value)) if isinstance(default, list) else None
        specs.append((arg, hint, field(default_factory=make) if make else field(default=default)))
    return make_dataclass(name, specs)


def _predictor_arguments(cls: type) -> list[tuple[str, Any, Any]]:
    """Arguments of a predictor and of the bases it forwards ``**kwargs`` to, most derived first."""
    seen: dict[str, tuple[str, Any, Any]] = {}
    for init in init_chain(cls):
        for arg in _arguments(init):
            seen.setdefault(arg[0], arg)
    return list(seen.values())


def hybrid_arguments() -> list[tuple[str, Any, Any]]:
    """Every setting ``hybrid_callbacks`` accepts except the predictor: the phase settings, ``bandit`` and the
    settings of the engine's components."""
    explicit = [arg for arg in _arguments(hybrid_callbacks) if arg[0] != "predictor"]
    owned = [
        arg
        for cls in SETTING_OWNERS.values()
        for arg in _arguments(cls.__init__)
        if arg[0] in settings_of(cls.__init__)
    ]
    return explicit + owned


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
    from lightning_hybrid.callbacks.routing import owned_settings, reads
    from lightning_hybrid.engine import family_of

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
    name: _schema(f"{cls.__name__}Settings", f"{cls.__module__}.{cls.__qualname__}", _predictor_arguments(cls))
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
