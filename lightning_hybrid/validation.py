"""Argument checks shared by every component, so bad settings fail at construction with one message style."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from lightning_hybrid.settings import did_you_mean


def _fail(owner: str, name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{owner}: `{name}` must be {allowed}, got {value!r}")


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``True`` or ``False`` (not a truthy value: a misspelt YAML string would otherwise pass)."""
    if not isinstance(value, bool):
        raise _fail(owner, name, value, "True or False")
    return value


def check_optional_bool(owner: str, name: str, value: Any, none_means: str = "") -> bool | None:
    """``True``, ``False`` or ``None`` (a choice made later, which ``none_means`` names in the message)."""
    if value is not None and not isinstance(value, bool):
        raise _fail(owner, name, value, "True, False or None" + (f" ({none_means})" if none_means else ""))
    return value


def check_int(owner: str, name: str, value: Any, minimum: int = 0) -> int:
    """An integer (bools refused) no smaller than ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(owner, name, value, f"an integer >= {minimum}")
    return value


def check_float(
    owner: str, name: str, value: Any, low: float, high: float = math.inf, *, open_low: bool = False
) -> float:
    """A finite number in ``[low, high]`` (or ``(low, high]`` with ``open_low``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and value <= high
    if not ok:
        bracket = "(" if open_low else "["
        upper = "inf)" if math.isinf(high) else f"{high}]"
        raise _fail(owner, name, value, f"a finite number in {bracket}{low}, {upper}")
    return float(value)


def check_choice(owner: str, name: str, value: Any, choices: Iterable[str]) -> str:
    """One of a fixed set of names; a misspelt one is told the closest."""
    choices = sorted(choices)
    if value not in choices:
        close = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ValueError(f"{_fail(owner, name, value, 'one of ' + ', '.join(repr(c) for c in choices))}{close}")
    return value
