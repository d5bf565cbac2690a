"""The contract every dynamics predictor fulfils.

A predictor sees the actual per-step parameter update ``delta`` of ordinary steps and, on request, plans a
Predict segment: a fixed *direction* tensor per parameter (shared by all steps of the segment, so applying it is
one fused ``torch._foreach_add_`` per parameter group) and per-step, per-group *scales*, plus the loss trajectory
it expects with an upper bound the divergence monitor enforces.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from lightning_hybrid.stats import sq_norm

TensorGroups = Sequence[Sequence[Tensor]]


@dataclass
class Plan:
    """A planned Predict segment of ``horizon`` steps.

    ``scales[h][g]`` multiplies group ``g``'s direction at predicted step ``h``. ``loss[h]`` and ``loss_upper[h]``
    are the expected loss and its bound when measured at step ``h`` of the segment, i.e. after ``h`` predicted
    updates; index ``horizon`` is the first ordinary step after the segment, which verifies it.
    """

    scales: list[list[float]]
    loss: list[float]
    loss_upper: list[float]
    confidence: float

    @property
    def horizon(self) -> int:
        return len(self.scales)

    def is_finite(self) -> bool:
        values = [v for row in self.scales for v in row] + self.loss + self.loss_upper + [self.confidence]
        return all(math.isfinite(v) for v in values)

    def fits(self, groups: TensorGroups, directions: TensorGroups, sum_across_ranks: Any) -> bool:
        """Whether the plan can be applied to parameter ``groups`` along ``directions``: at least one step, finite
        numbers, a verdict bound for every step, one scale and one direction per group and tensor, of the same
        shapes, and finite directions on every rank (``sum_across_ranks`` sums their norms over the ranks)."""
        if self.horizon < 1 or not self.is_finite() or len(self.loss_upper) != self.horizon + 1:
            return False
        if len(directions) != len(groups) or any(len(row) != len(groups) for row in self.scales):
            return False
        for group, dirs in zip(groups, directions):
            if [tuple(p.shape) for p in group] != [tuple(d.shape) for d in dirs]:
                return False
        norms = sum_across_ranks(torch.stack([sq_norm(list(d)) for d in directions]))
        return bool(torch.isfinite(norms).all())  # a non-finite shard on any rank invalidates the plan everywhere

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Plan:
        return cls(**state)


@dataclass
class UpdateStats:
    """How well the predictor's one-step prediction ``p`` matched the actual update, per parameter group."""

    actual_sq: list[float]  # ||delta||^2
    predicted_sq: list[float]  # ||p||^2
    dot: list[float]  # <delta, p>
    loss: float
    predicted_loss: float

    @property
    def relative_error(self) -> float:
        """``||delta - p|| / ||delta||`` over all groups."""
        resid = sum(a - 2 * d + p for a, d, p in zip(self.actual_sq, self.dot, self.predicted_sq))
        total = sum(self.actual_sq)
        return math.sqrt(max(resid, 0.0) / total) if total > 0 else 0.0

    def scaled(self, factors: Sequence[float]) -> UpdateStats:
        """The same comparison for the prediction multiplied by ``factors`` (one per group)."""
        return UpdateStats(
            actual_sq=self.actual_sq,
            predicted_sq=[p * f * f for p, f in zip(self.predicted_sq, factors)],
            dot=[d * f for d, f in zip(self.dot, factors)],
            loss=self.loss,
            predicted_loss=self.predicted_loss,
        )

    def best_scale(self, group: int) -> float:
        """The multiple of the prediction closest to the actual update (least squares)."""
        p = self.predicted_sq[group]
        return self.dot[group] / p if p > 0 else 1.0


class Predictor(ABC):
    """Base class of dynamics predictors; subclasses are registered by their ``name``.

    ``features`` arguments are the :class:`~lightning_hybrid.encoder.StateEncoder` vector describing the training
    state *before* the step concerned.
    """

    name: ClassVar[str]
    family: ClassVar[str] = "segments"  # the prediction family that runs per-step predictors: Predict segments
    # whether :meth:`observe` splits into :meth:`track` (on the device, at the step) and :meth:`learn` (on the host,
    # later): the engine then reads the steps it observes once per cycle instead of on every step
    splits_observation: ClassVar[bool] = False

    @staticmethod
    def sum_across_ranks(statistic: Tensor) -> Tensor:
        """Sums a statistic of the local tensors over the ranks; the scheduler replaces it under FSDP, where each
        rank sees only its shards."""
        return statistic

    @abstractmethod
    def setup(self, params: TensorGroups, feature_dim: int) -> None:
        """Allocate state shaped like ``params`` (a list of parameter groups) on their device; ``feature_dim`` is
        the length of the feature vectors that :meth:`observe` and :meth:`plan` will receive."""

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether enough has been observed to plan a segment."""

    @abstractmethod
    def confidence(self) -> float:
        """Current confidence in ``[0, 1]`` that a planned segment will track real training."""

    def release(self) -> None:  # noqa: B027 (a hook: predictors that hold nothing parameter-sized need not override it)
        """The end of ``fit``: move parameter-sized state to host memory, as Lightning moves the optimizer's state at
        teardown; :meth:`setup` brings it back to the next ``fit``'s device."""

    def uncertainty(self) -> float:
        """Disagreement of an ensemble about the next segment (0 for single models)."""
        return 0.0

    @abstractmethod
    def observe(
        self, step: int, loss: float, deltas: TensorGroups | None, features: Tensor | None = None
    ) -> UpdateStats | None:
        """Learn from an ordinary step. ``deltas`` is scratch the predictor may overwrite; ``None`` when only
        the loss is known. Returns how the prediction for this step compared with the actual update."""

    def track(self, deltas: TensorGroups, keep: Tensor | None = None) -> Tensor:
        """The device half of :meth:`observe` (where ``splits_observation``): fold ``deltas`` into the predictor's
        tensors now, since the buffer holding them is reused next step, and return the statistics :meth:`learn`
        needs as a device tensor. ``keep`` (a 0-d device tensor, 1 or 0) is 0 for an update the optimizer skipped
        on the device: it is then folded in with weight zero."""
        raise NotImplementedError(f"{type(self).__name__} does not split its observation")

    def learn(
        self, step: int, loss: float, tracked: list[list[float]], features: Tensor | None = None
    ) -> UpdateStats | None:
        """The host half of :meth:`observe`, for an update :meth:`track` folded in; ``tracked`` is its result read
        to the host. Called in step order, after the steps before it have been learnt."""
        raise NotImplementedError(f"{type(self).__name__} does not split its observation")

    def skip(self, tracked: list[list[float]]) -> None:
        """An update :meth:`track` folded in with weight zero (the optimizer skipped it): nothing to learn, but the
        predictor's host statistics must follow its tensors."""
        raise NotImplementedError(f"{type(self).__name__} does not split its observation")

    @abstractmethod
    def plan(self, horizon: int, features: Tensor | None = None) -> Plan:
        """Plan a segment of ``horizon`` steps starting after the last observed step."""

    @abstractmethod
    def directions(self) -> TensorGroups:
        """Per-group direction tensors for the planned segment (constant while it runs)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state; may be called before :meth:`setup`, which then applies it."""
