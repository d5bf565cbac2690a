"""What every hybrid callback shares: it runs under the HybridScheduler, and its checkpointed state is
versioned, migrated from earlier layouts and checked before anything is restored."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from typing_extensions import override

from lightning_hybrid.lightning_packages import CALLBACK_BASES, MisconfigurationException

# Layout of the hybrid callbacks' checkpointed state; raise it when a layout changes, and migrate in `_migrate`.
# 1: the scheduler's state one flat dictionary; 2: the engine's parts and its prediction family apart; 3: the
# scheduler's state holds whether the checkpoint was written inside an unverified prediction (version 2 wrote that
# at the checkpoint's top level); 4: the scheduler's state holds the states of the components it holds (up to 3, every
# component was a callback of its own).
STATE_VERSION = 4

LOAD_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError)

# The hooks Lightning calls on every callback at every training or validation batch. Each call costs about 2 µs of
# host time (a profiler context, the state key) even when the hook does nothing; Lightning skips a hook that is not
# callable. The hybrid components set those they do not define to ``None``.
PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
)


@contextlib.contextmanager
def _refusing(name: str, undo: Callable[[], None] | None = None) -> Iterator[None]:
    """Turn an error while restoring a checkpoint's state into one that says so (after ``undo``); an error that is
    already a message of ours passes unchanged."""
    try:
        yield
    except LOAD_ERRORS as err:
        if undo is not None:
            undo()
        if str(err).startswith(name):
            raise
        raise ValueError(
            f"{name}: the checkpoint's state could not be restored ({type(err).__name__}: {err}); it was not "
            "written by a compatible lightning-hybrid, or it is damaged"
        ) from err


class HybridComponent(*CALLBACK_BASES):
    """Base of the hybrid callbacks, a ``Callback`` of each installed Lightning package (``lightning.pytorch``,
    ``pytorch_lightning``); refuses to run a ``fit`` without the ``HybridScheduler`` that runs them.

    Subclasses keep their checkpointed state in ``_state``/``_load``, and turn an earlier version's layout into
    this one in ``_migrate``. ``state_dict`` adds the version; ``load_state_dict`` refuses a state from a newer
    lightning-hybrid or one that lacks a key, naming the callback and what is wrong, and restores the callback as
    it was if loading fails part-way. A state without a version was written before versioning, with the layout of
    version 1.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook in PER_BATCH_HOOKS:
            if any(getattr(cls, hook) is getattr(base, hook) for base in CALLBACK_BASES):  # Lightning's no-op
                setattr(cls, hook, None)

    def _state(self) -> dict[str, Any]:
        return {}

    def _load(self, state: dict[str, Any]) -> None:
        pass

    def _migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """``state``, written with layout ``version``, in this version's layout (unchanged by default)."""
        return state

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
        with _refusing(name):
            state = self._migrate(state, version)
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
        with _refusing(name, undo=None if backup is None else lambda: self._load(backup)):  # nothing half-restored
            self._load(state)

    runs_the_plugin = False  # the HybridScheduler's: the one callback that runs the others

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and find_scheduler(trainer) is None:
            raise MisconfigurationException(
                f"{type(self).__name__} is a component of the HybridScheduler callback, which runs it; add "
                "`HybridScheduler()` (from lightning_hybrid) to the Trainer's callbacks, or use it alone: it brings "
                "the components its mode needs."
            )


def find_scheduler(trainer: Any) -> Any:
    """The trainer's ``HybridScheduler`` (known by its marker: it builds on this module), or ``None`` for a plain
    run."""
    return next((cb for cb in trainer.callbacks if getattr(cb, "runs_the_plugin", False)), None)


class HostComponent(HybridComponent):
    """A callback that holds one plain algorithm object (``hosted``) and checkpoints its ``state_dict``, as
    Lightning's ``StochasticWeightAveraging`` holds an ``AveragedModel``."""

    @property
    def hosted(self) -> Any:
        raise NotImplementedError

    @override
    def _state(self) -> dict[str, Any]:
        return self.hosted.state_dict()

    @override
    def _load(self, state: dict[str, Any]) -> None:
        self.hosted.load_state_dict(state)
