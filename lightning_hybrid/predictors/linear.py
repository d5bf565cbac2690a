"""``linear``: continue the recent average update, scaled by a least-squares fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lightning_hybrid.predictors.direction import DirectionPredictor
from lightning_hybrid.settings import Float, setting


@dataclass(eq=False)
class LinearPredictor(DirectionPredictor):
    """Each predicted step applies ``s_g * m``; the loss follows the line through recent losses.

    ``s_g`` is fitted per parameter group by exponentially weighted least squares of the actual update on the
    average *before* it, so it shrinks when updates are noisy and grows when they are consistent.
    """

    name = "linear"

    scale_decay: float = setting(
        0.95, "memory of the per-group least-squares scale fit", Float(0.0, 1.0, open_high=True)
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._num: list[float] = []
        self._den: list[float] = []

    def _build(self, num_groups: int, feature_dim: int, device: Any) -> None:
        self._num, self._den = [0.0] * num_groups, [0.0] * num_groups

    def scales(self) -> list[float]:
        return [self._clip_scale(n / d) if d > 0 else 0.0 for n, d in zip(self._num, self._den)]

    def _scales(self, features: Tensor | None) -> list[float]:
        return self.scales()

    def _learn(self, features: Tensor | None, dots: list[float], avg_sq: list[float], loss_change: float) -> None:
        b = self.scale_decay
        self._num = [b * n + (1 - b) * d for n, d in zip(self._num, dots)]
        self._den = [b * n + (1 - b) * m for n, m in zip(self._den, avg_sq)]

    def _extra_state(self) -> dict[str, Any]:
        return {"num": list(self._num), "den": list(self._den)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._num, self._den = list(state["num"]), list(state["den"])
