"""The app's command-line overrides of hybrid settings, checked before Hydra composes them: a key in the wrong group
(``hybrid.outer_lr``, a setting of the ``predictor`` group) is refused naming where it belongs, and a misspelt one
(``hybrid.ful_steps``) names the closest keys, where Hydra would say only that the key is not in the schema (and
suggest appending it with ``+``, which then fails further on)."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from lightning_hybrid.schema import PREDICTOR_SETTINGS, HybridSettings, setting_names
from lightning_hybrid.settings import did_you_mean

GROUPS = ("hybrid", "predictor")


def _predictors_of(name: str) -> list[str]:
    return [p for p, schema in PREDICTOR_SETTINGS.items() if name in setting_names(schema)]


def misplaced(overrides: Sequence[str]) -> str | None:
    """The message for the first override that sets a key the ``hybrid`` or ``predictor`` group does not have, or
    ``None``. Overrides that do not parse are left to Hydra, which names them."""
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("-")])
    except HydraException:
        return None
    hybrid = setting_names(HybridSettings)
    predictor = sorted({n for schema in PREDICTOR_SETTINGS.values() for n in setting_names(schema)})
    chosen = next((o.value() for o in parsed if o.key_or_group == "predictor" and isinstance(o.value(), str)), None)
    for override in parsed:
        group, _, key = override.key_or_group.partition(".")
        if group not in GROUPS or not key or "." in key or override.is_delete():
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
