"""Either Lightning: the plugin's callbacks run in a Trainer of ``lightning.pytorch`` or of the standalone
``pytorch_lightning`` (the same release under its own name), whichever is installed, or both. Each callback is a
subclass of every installed package's ``Callback``, a Trainer's objects are checked against each package's classes,
and the plugin's configuration error is each package's ``MisconfigurationException``. The hybrid strategies of the
per-step mode, the app and the demos build on ``lightning.pytorch``."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from lightning_utilities.core import rank_zero

# each side of Lightning under its two names: the unified package's module, then the standalone package
_NAMES = {"pytorch": ("lightning.pytorch", "pytorch_lightning"), "fabric": ("lightning.fabric", "lightning_fabric")}


def _modules(path: str) -> list[ModuleType]:
    side, _, rest = path.partition(".")
    found = []
    for package in _NAMES[side]:
        try:
            found.append(importlib.import_module(f"{package}.{rest}" if rest else package))
        except ImportError:
            continue
    return found


def module(path: str) -> ModuleType:
    """``path`` of the first installed package: ``module("pytorch.utilities.data")``."""
    return _modules(path)[0]


def classes(path: str, name: str) -> tuple[type, ...]:
    """``name`` as each installed package defines it: ``classes("pytorch.strategies", "DeepSpeedStrategy")`` holds
    ``lightning.pytorch``'s and ``pytorch_lightning``'s (one class where both share it), for ``isinstance``."""
    return tuple(dict.fromkeys(getattr(each, name) for each in _modules(path)))


def _import_both() -> list[ModuleType]:
    """Each installed package, imported. Importing one points Lightning's shared rank-zero messages at its own
    logger; the process keeps the one it had (or, where none was imported yet, the first package's), so importing
    the plugin changes nothing of the user's logging."""
    before = rank_zero.log
    packages = _modules("pytorch")
    kept = not before.name.startswith("lightning_utilities")
    if packages:
        rank_zero.log = before if kept else logging.getLogger(f"{packages[0].__name__}.utilities.rank_zero")
    return packages


HAS_LIGHTNING = any(package.__name__ == "lightning.pytorch" for package in _import_both())
CALLBACK_BASES = classes("pytorch", "Callback")
if not CALLBACK_BASES:
    raise ImportError("lightning-hybrid runs in a Lightning Trainer: install `lightning` (or `pytorch-lightning`)")


class MisconfigurationException(*classes("fabric.utilities.exceptions", "MisconfigurationException")):
    """A setting, strategy or module the plugin cannot run with, said before training; either package's
    ``MisconfigurationException`` catches it."""
