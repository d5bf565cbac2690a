"""What every hybrid callback shares: it only makes sense under a hybrid strategy, and its checkpointed state is
versioned and checked before anything is restored."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_hybrid.strategy import HybridStrategyMixin

STATE_VERSION = 1  # layout of the hybrid callbacks' checkpointed state; raise it when the layout changes

LOAD_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError)


class HybridComponent(Callback):
    """Base of the hybrid callbacks; refuses to run a ``fit`` without a hybrid strategy.

    Subclasses keep their checkpointed state in ``_state``/``_load``. ``state_dict`` adds the version;
    ``load_state_dict`` refuses a state from a newer lightning-hybrid or one that lacks a key, naming the
    callback and what is wrong, and restores the callback as it was if loading fails part-way. A state without a
    version was written before versioning, with the layout of version 1.
    """

    def _state(self) -> dict[str, Any]:
        return {}

    def _load(self, state: dict[str, Any]) -> None:
        pass

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **self._state()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        name = type(self).__name__
        version = state.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
            raise ValueError(
                f"{name}: the checkpoint's state has version {version!r}, but this lightning-hybrid reads versions "
                f"1 to {STATE_VERSION}; resume it with the lightning-hybrid that wrote it (or a newer one)"
            )
        try:
            backup: dict[str, Any] | None = self._state()
        except LOAD_ERRORS:  # not built yet (learned predictors build on first use): nothing to lose
            backup = None
        missing = sorted(set(backup or {}) - set(state))
        if missing:
            raise ValueError(
                f"{name}: the checkpoint's state lacks {missing}; it was not written by a compatible "
                "lightning-hybrid, or it is damaged"
            )
        try:
            self._load(state)
        except LOAD_ERRORS as err:
            if backup is not None:
                self._load(backup)  # nothing half-restored
            if str(err).startswith(name):
                raise  # already a message of ours
            raise ValueError(
                f"{name}: the checkpoint's state could not be restored ({type(err).__name__}: {err}); it was not "
                "written by a compatible lightning-hybrid, or it is damaged"
            ) from err

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not isinstance(trainer.strategy, HybridStrategyMixin):
            raise MisconfigurationException(
                f"{type(self).__name__} needs a hybrid strategy, but the Trainer uses "
                f"{type(trainer.strategy).__name__}. Pass `strategy=HybridPredictStrategy()` to the Trainer "
                '(or `strategy="hybrid"`; `"hybrid_ddp"` or `"hybrid_fsdp"` for several devices). DeepSpeed is not '
                "supported."
            )
