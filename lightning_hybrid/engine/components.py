"""What the engine needs from the components the hybrid callbacks host: the contracts, not the classes, so the
engine can be built and stepped with any objects that keep them (the callbacks' own, or test doubles)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from lightning_hybrid.encoder import StateEncoder
from lightning_hybrid.predictors import Plan, Predictor, UpdateStats


class Monitor(Protocol):
    """Names divergence in a loss measured at predicted weights (see ``DivergenceMonitor``)."""

    events: dict[str, int]

    def observe(self, loss: float, grad_norm: float) -> None: ...
    def gradient_outlier(self, grad_norm: float) -> bool: ...
    def start_segment(self) -> None: ...
    def check(self, loss: float, upper_bound: float) -> str | None: ...


class Corrector(Protocol):
    """Corrects plans from residuals of earlier segments (see ``ResidualCorrector``)."""

    def correction(self, features: Tensor, step: int, num_groups: int) -> tuple[list[float], float]: ...
    def correct(self, plan: Plan, features: Tensor, step: int) -> tuple[Plan, list[float]]: ...
    def reanchor(self, plan: Plan, position: int, observed_loss: float) -> Plan: ...
    def observe(self, step: int, stats: UpdateStats, features: Tensor) -> None: ...


class Bandit(Protocol):
    """Chooses segment horizons and learns from their reward (see ``HorizonBandit``)."""

    arms: list[int]
    counts: list[int]
    cost: str

    def setup_arms(self, max_predict_steps: int, feature_dim: int) -> None: ...
    def choose(self, features: Tensor) -> int: ...
    def update(self, arm: int, features: Tensor, reward: float) -> None: ...
    def begin(self, arm: int, features: Tensor, loss_slope: float, loss_noise: float) -> None: ...
    def record_step(self, predicted: bool, seconds: float, loss: float | None, correcting: bool) -> Any: ...
    def finish(self) -> float | None: ...
    def abort(self) -> None: ...


@dataclass
class Components:
    """The engine's collaborators: a predictor and its state encoder, the corrector, the monitor, and optionally
    the horizon bandit."""

    predictor: Predictor
    encoder: StateEncoder
    corrector: Corrector
    monitor: Monitor
    bandit: Bandit | None = None
