"""What a setting is: a field of its owner's dataclass, declared once with :func:`setting`: its name, type and
default are the field's, and the field's metadata holds what values are allowed, the modes that read it and its
description. The owner's constructor checks it (:class:`Settings`); ``hybrid_callbacks``'s routing, the app's Hydra
schemas and override check, the summary's record of a run's settings, the "did you mean" of a misspelt one and
``docs/settings.md`` all read it from there."""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Iterable
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from typing_extensions import TypedDict

SETTING = "lightning_hybrid.setting"  # the metadata key of a field that is a setting
# The built-in prediction families that read a setting some modes do not (``engine.families``): the default rule's
# jumps, gpa's averaging, the per-step mode's segments.
EVERY_MODE = ("jumps", "averaging", "segments")
CYCLES = ("jumps", "segments")
PER_STEP = ("segments",)


# -- the checks --------------------------------------------------------------------------------------------------
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


def _int_at_least(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def check_int(owner: str, name: str, value: Any, minimum: int = 0) -> int:
    """An integer (bools refused) no smaller than ``minimum``."""
    if not _int_at_least(value, minimum):
        raise _fail(owner, name, value, f"an integer >= {minimum}")
    return value


def _interval(low: float, high: float, open_low: bool, open_high: bool) -> str:
    upper = "inf)" if math.isinf(high) else f"{high}{')' if open_high else ']'}"
    return f"{'(' if open_low else '['}{low}, {upper}"


def check_float(
    owner: str,
    name: str,
    value: Any,
    low: float,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> float:
    """A finite number in ``[low, high]``, either end open where asked."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and (value < high if open_high else value <= high)
    if not ok:
        raise _fail(owner, name, value, f"a finite number in {_interval(low, high, open_low, open_high)}")
    return float(value)


def check_choice(owner: str, name: str, value: Any, choices: Iterable[str]) -> str:
    """One of a fixed set of names; a misspelt one is told the closest."""
    choices = sorted(choices)
    if value not in choices:
        close = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ValueError(f"{_fail(owner, name, value, 'one of ' + ', '.join(repr(c) for c in choices))}{close}")
    return value


# -- what a setting allows: each kind checks a value and says, for the reference, what it takes --------------------
@dataclass(frozen=True)
class Int:
    minimum: int = 0
    none_means: str | None = None  # ``None`` is allowed too, and means this

    def __call__(self, owner: str, name: str, value: Any) -> int | None:
        if self.none_means is None:
            return check_int(owner, name, value, self.minimum)
        if value is not None and not _int_at_least(value, self.minimum):
            raise _fail(owner, name, value, f"an integer >= {self.minimum} or None ({self.none_means})")
        return value

    def allowed(self) -> str:
        return f"integer ≥ {self.minimum}" + (" or `None`" if self.none_means is not None else "")


@dataclass(frozen=True)
class Float:
    low: float = 0.0
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False

    def __call__(self, owner: str, name: str, value: Any) -> float:
        return check_float(owner, name, value, self.low, self.high, open_low=self.open_low, open_high=self.open_high)

    def allowed(self) -> str:
        low = f"{'>' if self.open_low else '≥'} {self.low:g}"
        high = f"{'<' if self.open_high else '≤'} {self.high:g}"
        if math.isinf(self.high):
            return low
        if math.isinf(self.low):
            return high
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"


@dataclass(frozen=True)
class Bool:
    none_means: str | None = None  # ``None`` is allowed too, and means this

    def __call__(self, owner: str, name: str, value: Any) -> bool | None:
        if self.none_means is None:
            return check_bool(owner, name, value)
        return check_optional_bool(owner, name, value, self.none_means)

    def allowed(self) -> str:
        return "`True`, `False`" + (" or `None`" if self.none_means is not None else "")


@dataclass(frozen=True)
class Choice:
    choices: tuple[str, ...]

    def __call__(self, owner: str, name: str, value: Any) -> str:
        return check_choice(owner, name, value, self.choices)

    def allowed(self) -> str:
        return ", ".join(f"`{c}`" for c in self.choices)


@dataclass(frozen=True)
class Ints:
    """A non-empty sequence of integers no smaller than ``minimum``, kept as a tuple."""

    minimum: int = 0

    def __call__(self, owner: str, name: str, value: Any) -> tuple[int, ...]:
        bad = isinstance(value, (str, bytes)) or not isinstance(value, Iterable)
        items = [] if bad else list(value)
        if not items or any(isinstance(a, bool) or not isinstance(a, int) or a < self.minimum for a in items):
            raise _fail(owner, name, value, f"a non-empty list of integers >= {self.minimum}")
        return tuple(items)

    def allowed(self) -> str:
        return f"integers ≥ {self.minimum}"


Check = Int | Float | Bool | Choice | Ints


# -- declaring settings ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Meta:
    doc: str  # the one description: the reference page and the owner's help read it
    check: Check
    reads: tuple[str, ...] | None  # the built-in prediction families that read it; ``None``: wherever its owner runs


def setting(default: Any, doc: str, check: Check, *, reads: tuple[str, ...] | None = None) -> Any:
    """A dataclass field that is a setting: its default, its description, the values it allows and, for the
    settings some modes do not read, the prediction families (``jumps``, ``averaging``, ``segments``) that do."""
    return field(default=default, metadata={SETTING: Meta(doc, check, reads)})


def redefault(owner: type, name: str, default: Any) -> Any:
    """A base class's setting with another default (a subclass's tuning), its description and check kept."""
    return field(default=default, metadata=next(f for f in fields(owner) if f.name == name).metadata)


class Settings:
    """Base of the dataclasses whose :func:`setting` fields are settings: construction checks each, in order, naming
    the owner as users configure it (``owner``, else the class's name); subclasses build their state in
    ``__post_init__`` after calling this one's."""

    owner: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        owner = self.owner or type(self).__name__
        for f in setting_fields(type(self)):
            setattr(self, f.name, f.metadata[SETTING].check(owner, f.name, getattr(self, f.name)))


@dataclass(frozen=True)
class Setting:
    """One declared setting, as the routing, the schemas and the reference read it."""

    name: str
    owner: type
    hint: Any
    default: Any
    doc: str
    check: Check
    reads: tuple[str, ...] | None


def setting_fields(cls: type) -> list[Field]:
    return [f for f in fields(cls) if SETTING in f.metadata] if is_dataclass(cls) else []


def declared(cls: type) -> list[Setting]:
    """The settings ``cls`` declares (its bases' included), in the order of its constructor."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in setting_fields(cls):
        meta: Meta = f.metadata[SETTING]
        default = None if f.default is MISSING else f.default
        out.append(Setting(f.name, cls, hints[f.name], default, meta.doc, meta.check, meta.reads))
    return out


def setting_names(cls: type) -> list[str]:
    return [f.name for f in setting_fields(cls)]


def setting_values(component: Any) -> dict[str, Any]:
    """A component's settings with the values it holds (tuples as lists, as JSON reads them back)."""
    values = {name: getattr(component, name) for name in setting_names(type(component))}
    return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


def settings_dict(name: str, *owners: type) -> Any:
    """A ``TypedDict`` of the settings ``owners`` declare, for a constructor's ``**settings: Unpack[...]``: what
    LightningCLI (jsonargparse) and type checkers read as its keywords."""
    return TypedDict(name, {s.name: s.hint for cls in owners for s in declared(cls)}, total=False)


def read_by(cls: type, family: str) -> tuple[str, ...]:
    """The settings of ``cls`` that the built-in family ``family`` reads."""
    return tuple(s.name for s in declared(cls) if s.reads is None or family in s.reads)


# -- did you mean --------------------------------------------------------------------------------------------------
def closest(name: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The known names most like a misspelt ``name``, closest first: those nearly as close as the closest."""
    scored = [(difflib.SequenceMatcher(None, name, known).ratio(), known) for known in sorted(set(names))]
    scored = sorted((s for s in scored if s[0] >= 0.6), key=lambda s: -s[0])[:n]
    return [known for score, known in scored if score >= scored[0][0] - 0.05]


def did_you_mean(name: str, names: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean `full_steps`?"`` where a known name is close to ``name``, else ``""`` (``prefix``: what
    the user writes before a name, ``hybrid.`` on the app's command line)."""
    matches = closest(name, names)
    return f"; did you mean {' or '.join(f'`{prefix}{m}`' for m in matches)}?" if matches else ""
