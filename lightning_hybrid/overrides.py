"""The app's command-line overrides, checked before Hydra composes them: a key in the wrong group
(``hybrid.outer_lr``, a setting of the ``predictor`` group) is refused naming where it belongs, and a misspelt one
(``hybrid.ful_steps``) names the closest keys, where Hydra would say only that the key is not in the schema (and
suggest appending it with ``+``, which then fails further on); a config group's misspelt option (``predictor=mpl``)
names the group's options and the closest, where Hydra lists its structured schemas among them. A ``trainer.``
key that is no argument of Lightning's ``Trainer`` (``trainer.max_step``) names the closest ones, where Hydra's
advice (``+trainer.max_step``) would fail in ``Trainer.__init__``."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from importlib.resources import files
from itertools import pairwise
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from lightning.pytorch import Trainer

from lightning_hybrid.schema import PREDICTOR_SETTINGS, HybridSettings, setting_names
from lightning_hybrid.settings import did_you_mean

CONFIG_MODULE = "lightning_hybrid.configs"  # where the app's config groups ship

GROUPS = ("hybrid", "predictor")
TRAINER_ARGUMENTS = sorted(set(inspect.signature(Trainer.__init__).parameters) - {"self"})


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
