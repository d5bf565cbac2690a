"""``linear``: continue the recent average update, scaled by a least-squares fit."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.predictors.base import Plan, Predictor, TensorGroups, UpdateStats
from lightning_hybrid.stats import LossTrend
from lightning_hybrid.validation import check_float, check_int


def _sq_norms(tensors: list[Tensor]) -> Tensor:
    """Sum of squares over a tensor list, as one fused reduction."""
    return torch.stack(torch._foreach_norm(tensors)).float().square().sum()


class LinearPredictor(Predictor):
    """Per-tensor exponential average ``m`` of recent updates; each predicted step applies ``s_g * m``.

    ``s_g`` is fitted per parameter group by exponentially weighted least squares of the actual update on the
    average *before* it, so it shrinks when updates are noisy and grows when they are consistent. Confidence is
    the moving average of the update variance that ``s_g * m`` explained. The loss trajectory is the least-squares
    line through recent losses; its upper bound adds ``bound_sigmas`` times the loss noise plus the trend size.

    Args:
        decay: weight of the old average in ``m`` per observed step, in ``[0, 1)``.
        scale_decay: memory of the least-squares scale fit, in ``[0, 1)``.
        max_scale: cap on ``s_g``; a predicted step is at most this many average updates.
        loss_window: number of recent ordinary-step losses in the trend fit (>= 3).
        bound_sigmas: width of the loss upper bound in noise standard deviations.
        min_observations: observed updates needed before the predictor is ``ready``.
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
        owner = "LinearPredictor"
        self.decay = check_float(owner, "decay", decay, 0.0, 1.0 - 1e-12)
        self.scale_decay = check_float(owner, "scale_decay", scale_decay, 0.0, 1.0 - 1e-12)
        self.max_scale = check_float(owner, "max_scale", max_scale, 0.0, open_low=True)
        self.loss_window = check_int(owner, "loss_window", loss_window, 3)
        self.bound_sigmas = check_float(owner, "bound_sigmas", bound_sigmas, 0.0, open_low=True)
        self.min_observations = check_int(owner, "min_observations", min_observations, 1)
        self._avg: list[list[Tensor]] = []
        self._num: list[float] = []
        self._den: list[float] = []
        self._conf = 0.0
        self._observed = 0
        self._trend = LossTrend(loss_window)
        self._pending: dict[str, Any] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def setup(self, params: TensorGroups) -> None:
        self._avg = [[torch.zeros_like(p) for p in group] for group in params]
        self._num = [0.0] * len(params)
        self._den = [0.0] * len(params)
        if self._pending is not None:
            state, self._pending = self._pending, None
            self.load_state_dict(state)

    @property
    def ready(self) -> bool:
        return self._observed >= self.min_observations and len(self._trend) >= 3

    def confidence(self) -> float:
        return self._conf

    def scales(self) -> list[float]:
        return [min(max(n / d, 0.0), self.max_scale) if d > 0 else 0.0 for n, d in zip(self._num, self._den)]

    # -- learning --------------------------------------------------------------------------------------------
    def observe(self, step: int, loss: float, deltas: TensorGroups | None) -> UpdateStats | None:
        level, slope, _ = self._trend.fit()
        predicted_loss = level + slope * (step - self._trend.points[-1][0]) if len(self._trend) else math.nan
        self._trend.add(step, loss)
        if deltas is None:
            return None
        scales = self.scales()
        rows = []
        with torch.no_grad():
            for delta, avg in zip(deltas, self._avg):
                delta = list(delta)
                actual = _sq_norms(delta)
                old = _sq_norms(avg)
                torch._foreach_sub_(delta, avg)  # delta := delta - m
                diff = _sq_norms(delta)
                torch._foreach_add_(avg, delta, alpha=1.0 - self.decay)  # m += (1 - decay) * (delta - m)
                rows.append(torch.stack([actual, old, diff]))
        actual_sq, avg_sq, diff_sq = torch.stack(rows).double().T.tolist()  # one host sync per step
        dots = [(a + m - d) / 2 for a, m, d in zip(actual_sq, avg_sq, diff_sq)]  # <delta, m> by polarisation
        stats = UpdateStats(
            actual_sq=actual_sq,
            predicted_sq=[s * s * m for s, m in zip(scales, avg_sq)],
            dot=[s * d for s, d in zip(scales, dots)],
            loss=loss,
            predicted_loss=predicted_loss,
        )
        b = self.scale_decay
        self._num = [b * n + (1 - b) * d for n, d in zip(self._num, dots)]
        self._den = [b * n + (1 - b) * m for n, m in zip(self._den, avg_sq)]
        explained = 1.0 - stats.relative_error**2 if sum(actual_sq) > 0 else 0.0
        explained = min(max(explained, 0.0), 1.0) if math.isfinite(explained) else 0.0
        self._conf = self.decay * self._conf + (1 - self.decay) * explained if self._observed else explained
        self._observed += 1
        return stats

    # -- planning --------------------------------------------------------------------------------------------
    def plan(self, horizon: int) -> Plan:
        level, slope, noise = self._trend.fit()
        scales = self.scales()
        ahead = range(1, horizon + 2)
        loss = [level + slope * h for h in ahead]
        upper = [mean + self.bound_sigmas * (noise + abs(slope) * h) for mean, h in zip(loss, ahead)]
        return Plan(scales=[list(scales) for _ in range(horizon)], loss=loss, loss_upper=upper, confidence=self._conf)

    def directions(self) -> TensorGroups:
        return self._avg

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "avg": [[t.detach().clone() for t in group] for group in self._avg],
            "num": list(self._num),
            "den": list(self._den),
            "conf": self._conf,
            "observed": self._observed,
            "trend": self._trend.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._avg:
            self._pending = state
            return
        shapes = [[tuple(t.shape) for t in g] for g in self._avg]
        saved = [[tuple(t.shape) for t in g] for g in state["avg"]]
        if shapes != saved:
            raise ValueError(
                f"LinearPredictor: checkpointed update averages have shapes {saved}, the model has {shapes}"
            )
        with torch.no_grad():
            for dst, src in zip(self._avg, state["avg"]):
                torch._foreach_copy_(dst, [s.to(d.device) for s, d in zip(src, dst)])
        self._num, self._den = list(state["num"]), list(state["den"])
        self._conf, self._observed = float(state["conf"]), int(state["observed"])
        self._trend.load_state_dict(state["trend"])
