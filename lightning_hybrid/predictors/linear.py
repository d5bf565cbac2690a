"""``linear``: continue the recent average update, scaled by a least-squares fit."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_hybrid.predictors.direction import DirectionPredictor
from lightning_hybrid.validation import check_float


class LinearPredictor(DirectionPredictor):
    """Each predicted step applies ``s_g * m``; the loss follows the line through recent losses.

    ``s_g`` is fitted per parameter group by exponentially weighted least squares of the actual update on the
    average *before* it, so it shrinks when updates are noisy and grows when they are consistent.

    Args:
        scale_decay: memory of the least-squares scale fit, in ``[0, 1)``.
        **kwargs: the shared settings of :class:`DirectionPredictor` (``decay``, ``max_scale``, ``loss_window``,
            ``bound_sigmas``, ``min_observations``).
    """

    name = "linear"

    def __init__(
        self,
        decay: float = 0.9,
        scale_decay: float = 0.95,
        max_scale: float = 2.0,
        loss_window: int = 32,
        bound_sigmas: float = 3.0,
        min_observations: int = 10,
    ) -> None:
        super().__init__(decay, max_scale, loss_window, bound_sigmas, min_observations)
        self.scale_decay = check_float("LinearPredictor", "scale_decay", scale_decay, 0.0, 1.0 - 1e-12)
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
