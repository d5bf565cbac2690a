"""ResidualCorrection: learns from what happened after Predict segments and corrects later predictions, in plain
torch (the :class:`~lightning_hybrid.ResidualCorrector` callback holds one and checkpoints it)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.predictors.base import Plan, UpdateStats
from lightning_hybrid.settings import Float, Int, Settings, setting


@dataclass(eq=False)
class ResidualCorrection(Settings):
    """A bounded store of residuals from Correct steps, recalled by similarity to correct new predictions.

    After a segment, each Correct step measures how the optimizer's real update relates to the predictor's: the
    least-squares multiple of the prediction (per parameter group; 1 is a perfect prediction, below 1 an
    overshoot) and the loss residual. A new plan's correction combines the ``neighbours`` stored residuals with
    the largest weight ``exp(-|f - f_i|^2 / (2 bandwidth^2 dim)) * time_decay^(age in steps)``, where ``f`` are the
    state features. Update factors are combined in log space and clipped to
    ``[1 / max_correction_factor, max_correction_factor]``.

    Micro-corrections: inside a segment, every ``correction_interval`` predicted steps with a forward check, the
    remaining loss trajectory is re-anchored on the loss just observed (the upper bound only ever tightens).
    """

    owner = "ResidualCorrector"  # the name users configure it by

    max_correction_factor: float = setting(
        2.0, "bound on a correction factor and its inverse (1 disables update corrections)", Float(1.0)
    )
    max_residuals: int = setting(256, "capacity of the residual store", Int(1))
    neighbours: int = setting(16, "stored residuals combined per correction", Int(1))
    bandwidth: float = setting(1.0, "feature-distance scale of the similarity weight", Float(0.0, open_low=True))
    time_decay: float = setting(0.995, "per-step decay of a residual's weight", Float(0.0, 1.0, open_low=True))
    correction_interval: int = setting(
        4, "predicted steps between micro-corrections (re-anchoring the loss); 0 disables them", Int(0)
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.residuals: deque[dict[str, Any]] = deque(maxlen=self.max_residuals)
        # Row ``slot`` of a residual holds its state features: one tensor for the whole store, so a long run's
        # residuals never add live tensors, and recall indexes rows instead of stacking a tensor per residual.
        self._features: Tensor | None = None
        self._next_slot = 0

    def _store(self, residual: dict[str, Any], features: Tensor) -> None:
        features = features.detach().float().cpu().flatten()
        if self._features is None or self._features.shape[1] != features.numel():
            self._features, self._next_slot = torch.zeros(self.max_residuals, features.numel()), 0
            self.residuals.clear()
        slot, self._next_slot = self._next_slot, (self._next_slot + 1) % self.max_residuals
        self._features[slot] = features  # the deque drops its oldest entry, the owner of this row, when full
        self.residuals.append(residual | {"slot": slot})

    def observe(self, step: int, stats: UpdateStats, features: Tensor) -> None:
        """Store a Correct step's residual."""
        bound = math.log(self.max_correction_factor)
        log_ratios = []
        for g in range(len(stats.actual_sq)):
            ratio = stats.best_scale(g)
            log_ratios.append(min(max(math.log(ratio), -bound), bound) if ratio > 0 else -bound)
        loss_residual = stats.loss - stats.predicted_loss
        residual = {"step": step, "log_ratios": log_ratios}
        self._store(residual | {"loss_residual": loss_residual if math.isfinite(loss_residual) else 0.0}, features)

    def correction(self, features: Tensor, step: int, num_groups: int) -> tuple[list[float], float]:
        """Update factor per group and loss offset for a prediction made now in state ``features``."""
        usable = [r for r in self.residuals if len(r["log_ratios"]) == num_groups]
        if not usable:
            return [1.0] * num_groups, 0.0
        stored = self._features[[r["slot"] for r in usable]]
        distance = (stored - features.detach().float().cpu()).square().sum(1)
        ages = torch.tensor([float(step - r["step"]) for r in usable])
        weights = torch.exp(-distance / (2 * self.bandwidth**2 * features.numel())) * self.time_decay**ages
        top = torch.topk(weights, min(self.neighbours, len(usable)))
        total = float(top.values.sum())
        if not total > 0:
            return [1.0] * num_groups, 0.0
        chosen = [(float(w), usable[i]) for w, i in zip(top.values.tolist(), top.indices.tolist())]
        log_factors = [sum(w * r["log_ratios"][g] for w, r in chosen) / total for g in range(num_groups)]
        offset = sum(w * r["loss_residual"] for w, r in chosen) / total
        return [math.exp(v) for v in log_factors], offset

    def correct(self, plan: Plan, features: Tensor, step: int) -> tuple[Plan, list[float]]:
        """Apply the correction for ``features`` to a freshly made plan; also return the factors."""
        num_groups = len(plan.scales[0]) if plan.scales else 0
        factors, offset = self.correction(features, step, num_groups)
        corrected = replace(
            plan,
            scales=[[s * f for s, f in zip(row, factors)] for row in plan.scales],
            loss=[v + offset for v in plan.loss],
            loss_upper=[v + max(offset, 0.0) for v in plan.loss_upper],
        )
        return corrected, factors

    def reanchor(self, plan: Plan, position: int, observed_loss: float) -> Plan:
        """Micro-correction: shift the rest of the loss trajectory onto a loss just measured at ``position``."""
        if self.correction_interval == 0 or position % self.correction_interval or not math.isfinite(observed_loss):
            return plan
        shift = observed_loss - plan.loss[position]
        rest = range(position + 1, len(plan.loss))
        loss = plan.loss[: position + 1] + [plan.loss[i] + shift for i in rest]
        upper = plan.loss_upper[: position + 1] + [plan.loss_upper[i] + min(shift, 0.0) for i in rest]
        return replace(plan, loss=loss, loss_upper=upper)

    def state_dict(self) -> dict[str, Any]:
        residuals = [{k: v for k, v in r.items() if k != "slot"} for r in self.residuals]
        for saved, r in zip(residuals, self.residuals):
            saved["features"] = self._features[r["slot"]].clone()
        return {"residuals": residuals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = deque(maxlen=self.max_residuals)
        self._features, self._next_slot = None, 0
        for saved in state["residuals"]:
            self._store({k: v for k, v in saved.items() if k != "features"}, saved["features"])
