"""What a setting is: a named constructor argument of a component, kept on it as an attribute of the same name. The
routing of ``hybrid_callbacks``, the app's schemas, the summary's record of a run's settings and the "did you mean"
of a misspelt one all read them from here."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

NOT_SETTINGS = ("self", "args", "kwargs", "settings", "predictor", "predictor_kwargs")  # wiring, not settings


def init_chain(cls: type) -> list[Callable[..., None]]:
    """The ``__init__`` of a class and of each base it forwards ``**kwargs`` to, most derived first: together they
    list its settings."""
    return [vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass) and klass is not object]


def settings_of(init: Callable[..., Any]) -> list[str]:
    """The settings a constructor takes, in its order."""
    return [name for name in inspect.signature(init).parameters if name not in NOT_SETTINGS]


def settings_of_chain(cls: type) -> list[str]:
    """A class's settings: its own and those of the bases it forwards ``**kwargs`` to."""
    return list(dict.fromkeys(name for init in init_chain(cls) for name in settings_of(init)))


def setting_values(component: Any) -> dict[str, Any]:
    """A component's settings with the values it holds (tuples as lists, as JSON reads them back)."""
    values = {name: getattr(component, name) for name in settings_of_chain(type(component))}
    return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


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
