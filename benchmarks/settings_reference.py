"""The tables of ``docs/settings.md``, written from the settings' declarations (``lightning_hybrid.settings``): each
mode's table lists the settings that mode reads, with the owner, default, allowed values and description declared
beside each; the predictors' table sets their defaults side by side. ``python -m benchmarks.record`` writes them
into the page's regions, and a test checks that the page holds what the declarations give."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.algorithms import DivergenceCheck, LinUCBHorizons, ResidualCorrection
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.encoder import Encoding
from lightning_hybrid.predictors import LinearPredictor, MLPPredictor, OuterMomentum, PrimalAveraging, RSSMPredictor
from lightning_hybrid.settings import declared

PER_STEP_PREDICTORS = (LinearPredictor, MLPPredictor, RSSMPredictor)


def _value(value: Any) -> str:
    if isinstance(value, tuple):
        return f"`{list(value)}`"
    if isinstance(value, (bool, type(None))):
        return f"`{value}`"
    return f"`{value}`" if isinstance(value, str) else repr(value)


def _owner(cls: type) -> str:
    return cls.owner or cls.__name__


def mode_table(family: str, *owners: type) -> str:
    """The settings ``family`` reads of ``owners``, one row each, the owner named where its rows begin."""
    lines = ["| owner | setting | default | allowed | meaning |", "|---|---|---|---|---|"]
    last = None
    for owner, s in ((cls, s) for cls in owners for s in declared(cls) if s.reads is None or family in s.reads):
        named = "" if owner is last else f"`{_owner(owner)}`"
        last = owner
        lines.append(f"| {named} | `{s.name}` | {_value(s.default)} | {s.check.allowed()} | {s.doc} |")
    return "\n".join(lines) + "\n"


def predictors_table() -> str:
    """The per-step predictors' settings, each predictor's default in its column (- where it takes none)."""
    declarations = [{s.name: s for s in declared(cls)} for cls in PER_STEP_PREDICTORS]
    header = " | ".join(f"`{cls.name}`" for cls in PER_STEP_PREDICTORS)
    lines = [f"| setting | {header} | allowed | meaning |", "|---" * (len(PER_STEP_PREDICTORS) + 3) + "|"]
    names = dict.fromkeys(name for settings in declarations for name in settings)
    for name in names:
        s = next(settings[name] for settings in declarations if name in settings)
        cells = " | ".join(_value(settings[name].default) if name in settings else "-" for settings in declarations)
        lines.append(f"| `{name}` | {cells} | {s.check.allowed()} | {s.doc} |")
    return "\n".join(lines) + "\n"


GENERATORS = {
    "settings-outer": lambda: mode_table("jumps", HybridConfig, DivergenceCheck, OuterMomentum),
    "settings-gpa": lambda: mode_table("averaging", HybridConfig, DivergenceCheck, PrimalAveraging),
    "settings-per-step": lambda: mode_table(
        "segments", HybridConfig, DivergenceCheck, ResidualCorrection, LinUCBHorizons, Encoding
    ),
    "settings-predictors": predictors_table,
}
