"""What the engine and its families need from the components the hybrid callbacks host: the contracts, not the
classes, so the engine can be built and stepped with any objects that keep them (the plain objects in
``lightning_hybrid.algorithms`` and ``lightning_hybrid.predictors``, or test doubles)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from lightning_hybrid.encoder import StateEncoder
from lightning_hybrid.predictors import Plan, UpdateStats


class Forecaster(Protocol):
    """What the engine reads of any predictor, whatever its family (see ``lightning_hybrid.predictors``): a
    per-step :class:`~lightning_hybrid.predictors.Predictor` or a
    :class:`~lightning_hybrid.predictors.TrajectoryRule` keeps it, and its family uses the rest."""

    name: str
    family: str  # the registered prediction family that runs it

    def confidence(self) -> float: ...
    def uncertainty(self) -> float: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Monitor(Protocol):
    """Names divergence in a loss measured at predicted weights, judges jumps and spots exploding gradients (see
    :class:`~lightning_hybrid.algorithms.DivergenceCheck`)."""

    events: dict[str, int]  # how often each reason fired

    def observe(self, loss: float, grad_norm: float) -> None: ...
    def gradient_outlier(self, grad_norm: float) -> bool: ...
    def outlier_limit(self) -> float: ...
    def start_segment(self) -> None: ...
    def check(self, loss: float, upper_bound: float) -> str | None: ...
    def diverged(self, loss: float) -> str | None: ...
    def judge_window(self, before: float, after: float, tolerance: float) -> str | None: ...


class Corrector(Protocol):
    """Corrects plans from residuals of earlier segments (see
    :class:`~lightning_hybrid.algorithms.ResidualCorrection`)."""

    def correction(self, features: Tensor, step: int, num_groups: int) -> tuple[list[float], float]: ...
    def correct(self, plan: Plan, features: Tensor, step: int) -> tuple[Plan, list[float]]: ...
    def reanchor(self, plan: Plan, position: int, observed_loss: float) -> Plan: ...
    def observe(self, step: int, stats: UpdateStats, features: Tensor) -> None: ...


class Bandit(Protocol):
    """Chooses segment horizons and learns from their reward (see
    :class:`~lightning_hybrid.algorithms.LinUCBHorizons`)."""

    horizons: list[int]  # the horizon of each arm played, once set up
    counts: list[int]
    cost: str

    def setup_arms(self, max_predict_steps: int, feature_dim: int) -> None: ...
    def choose(self, features: Tensor) -> int: ...
    def update(self, arm: int, features: Tensor, reward: float) -> None: ...
    def begin(self, arm: int, features: Tensor, loss_slope: float, loss_noise: float) -> None: ...
    def record_step(self, predicted: bool, seconds: float, loss: float | None, correcting: bool) -> None: ...
    def finish(self) -> float | None: ...
    def abort(self) -> None: ...


@dataclass
class Components:
    """The engine's collaborators: a predictor and its state encoder, the corrector (``None`` where the family uses
    none), the monitor, and optionally the horizon bandit."""

    predictor: Any  # a Forecaster; the family that runs it needs more (a Predictor, an OuterMomentum, ...)
    encoder: StateEncoder
    corrector: Corrector | None
    monitor: Monitor
    bandit: Bandit | None = None
