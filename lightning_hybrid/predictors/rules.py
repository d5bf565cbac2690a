"""Trajectory rules: prediction that keeps every backward pass and moves the weights along their trajectory over
many steps, the family published work finds paying for full-rank training (SNOO / one-worker DiLoCo), as opposed
to the per-step :class:`~lightning_hybrid.predictors.Predictor` that replaces backward passes.

A rule works on this rank's flat list of trainable tensors (its shards under FSDP) with fused ``torch._foreach_*``
operations; the engine decides when it acts, verifies and undoes what it did. Here: the base class; ``outer`` is
in ``outer.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

TensorList = Sequence[Tensor]


def load_into(owner: str, what: str, dst: list[Tensor], src: list[Tensor]) -> None:
    """Copy a checkpoint's tensors into ``dst``, on its devices, refusing any not shaped like the model's."""
    if [tuple(t.shape) for t in dst] != [tuple(t.shape) for t in src]:
        raise ValueError(f"{owner}: the checkpoint's {what} does not match the model's trainable tensors")
    with torch.no_grad():
        torch._foreach_copy_(dst, [s.to(d.device) for s, d in zip(src, dst)])


class TrajectoryRule(ABC):
    """Base class of trajectory rules; subclasses are registered by their ``name`` beside the predictors.

    Rules are not gated by the learning rate (``predict_lr_fraction``) and use no horizon bandit: they never skip
    a backward pass, so the regimes where per-step prediction failed do not apply to them.
    """

    name: ClassVar[str]
    family: ClassVar[str]  # the prediction family that runs the rule (``lightning_hybrid.engine.families``)
    _pending: dict[str, Any] | None = None  # a checkpoint's state, loaded before setup: applied there
    _released: dict[str, Any] | None = None  # the state on the host, after fit

    @abstractmethod
    def setup(self, params: TensorList, keep_jump: bool) -> None:
        """Allocate state shaped like ``params`` (this rank's trainable tensors, flat); a rule whose state a
        checkpoint may bring before setup ends with :meth:`_apply_pending`. ``keep_jump``: the engine verifies jumps
        after the fact, so the last one must be kept to be undone."""

    def _apply_pending(self) -> None:
        """The end of :meth:`setup`: the state the last ``fit`` ended with is dropped, and a checkpoint's state
        loaded before this ``fit`` is applied."""
        self._released = None
        if self._pending is not None:
            state, self._pending = self._pending, None
            self.load_state_dict(state)

    def _parked(self, empty: dict[str, Any]) -> dict[str, Any]:
        """The state while none is allocated: a checkpoint's waiting for setup, the one ``fit`` ended with, or
        ``empty``."""
        return self._pending or self._released or empty

    def _park(self, state: dict[str, Any]) -> None:
        """A checkpoint's state loaded before setup, which applies it."""
        self._pending, self._released = state, None

    def confidence(self) -> float:
        """Rules make no one-step prediction to be confident about; reported as 1 in the scalars."""
        return 1.0

    def uncertainty(self) -> float:
        return 0.0

    def release(self) -> None:  # noqa: B027 (a hook: rules that hold nothing between steps need not override it)
        """The end of ``fit``: let the device copies go, as Lightning moves the optimizer's state off the device at
        teardown. :meth:`state_dict` still returns the state (a checkpoint taken after ``fit``); the next ``fit``'s
        :meth:`setup` allocates it afresh, or restores a checkpoint loaded in between. Families call it."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state; may be called before :meth:`setup`, which then applies it."""
