"""The hybrid callbacks and :func:`hybrid_callbacks`, which builds the default set."""

from __future__ import annotations

from collections.abc import Iterable, MutableSequence
from typing import Any

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent, find_scheduler
from lightning_hybrid.callbacks.checkpoint_flag import is_unverified_checkpoint
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.memory import VRAMLogger
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.progress import HybridProgressBar
from lightning_hybrid.callbacks.scheduler import HybridScheduler
from lightning_hybrid.lightning_packages import HAS_LIGHTNING
from lightning_hybrid.predictors import AnyPredictor
from lightning_hybrid.setting_owners import SETTING_OWNERS
from lightning_hybrid.settings import check_optional_bool

if HAS_LIGHTNING:  # the per-step mode's strategies, by name for Trainer(strategy=...), as the callbacks are imported
    from lightning_hybrid.registry import register_strategies

    register_strategies()


def hybrid_callbacks(
    predictor: str | AnyPredictor = "outer", bandit: bool | None = None, **settings: Any
) -> list[HybridComponent]:
    """The plugin as a list: a :class:`HybridScheduler` built with these arguments, then the components it brings
    (``scheduler.components``), each listed so that it can be found and read among the Trainer's callbacks (and
    Lightning checkpoints each). The scheduler alone is the same plugin (it holds them); see it for ``predictor``,
    ``bandit`` and every setting."""
    check_optional_bool("hybrid_callbacks", "bandit", bandit)
    scheduler = HybridScheduler(predictor=predictor, bandit=bandit, **settings)
    return HybridCallbacks([scheduler, *scheduler.components])


class HybridCallbacks(MutableSequence):
    """What :func:`hybrid_callbacks` returns: a sequence of callbacks, used as a list is. Put where one callback is
    expected (a ``_target_`` inside a dict of callbacks, as lightning-hydra-template lists them), its first use says
    in one line which class is the whole plugin. Not a ``list``: Hydra would turn one among a Trainer's arguments into
    a ``ListConfig``, which fails with OmegaConf's own words before this could speak."""

    def __init__(self, callbacks: Iterable[HybridComponent]) -> None:
        self._callbacks = list(callbacks)

    def __getitem__(self, index: Any) -> Any:
        return self._callbacks[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        self._callbacks[index] = value

    def __delitem__(self, index: Any) -> None:
        del self._callbacks[index]

    def __len__(self) -> int:
        return len(self._callbacks)

    def insert(self, index: int, value: Any) -> None:
        self._callbacks.insert(index, value)

    def __add__(self, other: Iterable[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Iterable[Any]) -> list[Any]:
        return [*other, *self]

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, (list, HybridCallbacks)) else other)

    def __repr__(self) -> str:
        return f"HybridCallbacks({self._callbacks!r})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_callbacks":
            raise AttributeError(name)
        raise TypeError(
            "lightning_hybrid.hybrid_callbacks returns a list of callbacks, but it stands where one callback is "
            "expected: use `_target_: lightning_hybrid.HybridScheduler` (the same settings), which is the whole "
            "plugin in one callback"
        )


__all__ = [
    "SETTING_OWNERS",
    "DivergenceMonitor",
    "DynamicsPredictor",
    "HorizonBandit",
    "HybridCallbacks",
    "HybridComponent",
    "HybridProgressBar",
    "HybridScheduler",
    "ResidualCorrector",
    "VRAMLogger",
    "find_scheduler",
    "hybrid_callbacks",
    "is_unverified_checkpoint",
]
