"""ResidualCorrector: learns from the residuals after each Predict segment and corrects later predictions."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.predictors.base import Plan, UpdateStats
from lightning_hybrid.validation import check_float, check_int


class ResidualCorrector(HybridComponent):
    """Keeps the residuals of Correct steps and turns them into corrections of later plans.

    After a segment, the optimizer's real updates show whether the predicted direction should have gone further
    (the least-squares multiple of the prediction is above 1), stopped earlier (below 1) or was wrong (negative).
    Per parameter group, that multiple, clipped to ``[1 / max_correction_factor, max_correction_factor]``, is
    averaged into a factor that scales later predicted updates. The loss residual (actual minus predicted) is
    averaged into an offset added to later loss trajectories and bounds.

    Args:
        correction_decay: weight of the old correction per residual, in ``[0, 1)``.
        max_correction_factor: bound on the update correction factor and its inverse (>= 1).
        max_residuals: residuals kept for inspection (>= 1).
    """

    def __init__(
        self, correction_decay: float = 0.5, max_correction_factor: float = 2.0, max_residuals: int = 256
    ) -> None:
        owner = "ResidualCorrector"
        self.decay = check_float(owner, "correction_decay", correction_decay, 0.0, 1.0 - 1e-12)
        self.max_correction_factor = check_float(owner, "max_correction_factor", max_correction_factor, 1.0)
        self.max_residuals = check_int(owner, "max_residuals", max_residuals, 1)
        self.factors: list[float] = []
        self.loss_offset = 0.0
        self.residuals: deque[dict[str, Any]] = deque(maxlen=max_residuals)

    def factor(self, group: int) -> float:
        return self.factors[group] if group < len(self.factors) else 1.0

    def observe(self, step: int, stats: UpdateStats, loss_noise: float) -> None:
        """Store a Correct step's residual and update the corrections."""
        if len(self.factors) != len(stats.actual_sq):
            self.factors = [1.0] * len(stats.actual_sq)
        bound = self.max_correction_factor
        targets = [min(max(stats.best_scale(g), 1.0 / bound), bound) for g in range(len(self.factors))]
        self.factors = [self.decay * f + (1 - self.decay) * t for f, t in zip(self.factors, targets)]
        loss_residual = stats.loss - stats.predicted_loss
        if math.isfinite(loss_residual):
            limit = 3.0 * loss_noise if math.isfinite(loss_noise) else 0.0
            self.loss_offset = self.decay * self.loss_offset + (1 - self.decay) * loss_residual
            self.loss_offset = min(max(self.loss_offset, -limit), limit)
        self.residuals.append(
            {"step": step, "update_error": stats.relative_error, "loss_residual": loss_residual, "targets": targets}
        )

    def correct(self, plan: Plan) -> Plan:
        """Apply the current corrections to a freshly made plan."""
        scales = [[s * self.factor(g) for g, s in enumerate(row)] for row in plan.scales]
        offset = self.loss_offset
        return Plan(
            scales=scales,
            loss=[v + offset for v in plan.loss],
            loss_upper=[v + max(offset, 0.0) for v in plan.loss_upper],
            confidence=plan.confidence,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"factors": list(self.factors), "loss_offset": self.loss_offset, "residuals": list(self.residuals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.factors = [float(f) for f in state["factors"]]
        self.loss_offset = float(state["loss_offset"])
        self.residuals = deque(state["residuals"], maxlen=self.max_residuals)
