"""DirectionPredictor: what all built-in predictors share.

Each predicted step moves parameter group ``g`` along ``m_g``, the per-tensor exponential average of recent actual
updates, by a scale ``s_g``. The direction is tracked with a few fused ``torch._foreach_*`` ops per step (no
copy of the model); subclasses only decide the scales and the loss trajectory, from tiny models or statistics,
which keeps prediction cheap at any model size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.predictors.base import Plan, Predictor, TensorGroups, UpdateStats
from lightning_hybrid.settings import Float, Int, Settings, setting
from lightning_hybrid.stats import LossTrend, sq_norm


@dataclass(eq=False)
class DirectionPredictor(Settings, Predictor):
    """Predicts each step's update as ``s_g * m_g``; subclasses supply ``s_g`` and the loss slope.

    Confidence is the moving average of the share of the actual update's variance that the one-step prediction
    explained, times ``exp(-uncertainty)`` for ensembles.
    """

    decay: float = setting(
        0.9, "memory of the per-tensor average update `m` per observed step", Float(0.0, 1.0, True, True)
    )
    max_scale: float = setting(
        2.0, "bound on the scale: a predicted step is at most this many average updates", Float(0.0, open_low=True)
    )
    loss_window: int = setting(32, "recent ordinary-step losses in the loss-trend fit", Int(3))
    bound_sigmas: float = setting(3.0, "width of the loss upper bound in noise deviations", Float(0.0, open_low=True))
    min_observations: int = setting(10, "observed updates before the predictor may plan", Int(1))

    def __post_init__(self) -> None:
        super().__post_init__()
        self._avg: list[list[Tensor]] = []
        self._avg_sq: list[float] | None = None  # ||m||^2 per group, kept from the last step learnt
        self._tracked = False  # an update was folded in since the averages were set: ||m||^2 is kept, not measured
        self._conf = 0.0
        self._observed = 0
        self._trend = LossTrend(self.loss_window)
        self._pending: dict[str, Any] | None = None

    # -- for subclasses --------------------------------------------------------------------------------------
    def _build(self, num_groups: int, feature_dim: int, device: torch.device) -> None:
        """Create learned parts once the number of parameter groups and features is known."""

    def _scales(self, features: Tensor | None) -> list[float]:
        """One-step scale per group, in ``[0, max_scale]``."""
        raise NotImplementedError

    def _trajectory(self, features: Tensor | None, horizon: int) -> tuple[list[list[float]], list[float]]:
        """Scales for each of ``horizon`` steps, and the loss change per step for ``horizon + 1`` steps."""
        _, slope, _ = self._trend.fit()
        return [self._scales(features)] * horizon, [slope] * (horizon + 1)

    def _learn(self, features: Tensor | None, dots: list[float], avg_sq: list[float], loss_change: float) -> None:
        """Learn from one observed step: ``<delta, m>``, ``||m||^2`` per group, and the per-step loss change
        divided by the loss noise."""

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    # -- Predictor -------------------------------------------------------------------------------------------
    def setup(self, params: TensorGroups, feature_dim: int) -> None:
        shapes = [[tuple(p.shape) for p in group] for group in params]
        if shapes != [[tuple(t.shape) for t in group] for group in self._avg]:
            self._avg = [[torch.zeros_like(p) for p in group] for group in params]
            self._avg_sq, self._tracked = None, False
            self._build(len(params), feature_dim, params[0][0].device)
        else:  # the same model again: the averages learnt go on, on its device
            self._avg = [[t.to(p.device) for t, p in zip(g, pg)] for g, pg in zip(self._avg, params)]
        if self._pending is not None:
            state, self._pending = self._pending, None
            self.load_state_dict(state)

    @property
    def ready(self) -> bool:
        return self._observed >= self.min_observations and len(self._trend) >= 3

    def confidence(self) -> float:
        return self._conf * math.exp(-self.uncertainty())

    splits_observation = True

    def observe(
        self, step: int, loss: float, deltas: TensorGroups | None, features: Tensor | None = None
    ) -> UpdateStats | None:
        if deltas is None:  # nothing to learn from but the loss
            self._trend.add(step, loss)
            return None
        return self.learn(step, loss, self.track(deltas).tolist(), features)  # one host read per observed step

    def track(self, deltas: TensorGroups, keep: Tensor | None = None) -> Tensor:
        """Fold ``deltas`` into the averages in three passes per group: ``||delta||``, the average's update (one
        lerp) and the new average's norm, which :meth:`learn` keeps for the next step. Returns, per group,
        ``[||delta||^2, (||m||^2 before, after a reset,) ||m'||^2]``, summed over the ranks' shards under FSDP."""
        weight = 1.0 - self.decay
        rows = []
        with torch.no_grad():
            for delta, avg in zip(deltas, self._avg):
                delta = list(delta)
                norms = [sq_norm(delta)] if self._tracked else [sq_norm(delta), sq_norm(avg)]
                if keep is None:
                    torch._foreach_lerp_(avg, delta, weight)  # m := d m + (1 - d) delta
                else:  # the weight a device tensor: a skipped update is folded in with weight zero, without a read
                    torch._foreach_lerp_(avg, delta, [keep * weight] * len(delta))
                rows.append(torch.stack([*norms, sq_norm(avg)]))
        self._tracked = True
        return self.sum_across_ranks(torch.stack(rows)).double()

    def learn(
        self, step: int, loss: float, tracked: list[list[float]], features: Tensor | None = None
    ) -> UpdateStats | None:
        level, slope, noise = self._trend.fit()
        last_step = self._trend.points[-1][0] if len(self._trend) else step
        predicted_loss = level + slope * (step - last_step) if len(self._trend) else math.nan
        self._trend.add(step, loss)
        scales = self._scales(features)
        actual_sq, avg_sq, dots = self._statistics(tracked)
        stats = UpdateStats(
            actual_sq=actual_sq,
            predicted_sq=[s * s * m for s, m in zip(scales, avg_sq)],
            dot=[s * d for s, d in zip(scales, dots)],
            loss=loss,
            predicted_loss=predicted_loss,
        )
        gap = max(step - last_step, 1)
        loss_change = (loss - self._trend.points[-2][1]) / gap if len(self._trend) > 1 else 0.0
        noise = noise if math.isfinite(noise) and noise > 0 else 1.0
        self._learn(features, dots, avg_sq, min(max(loss_change / noise, -5.0), 5.0))
        explained = 1.0 - stats.relative_error**2 if sum(actual_sq) > 0 else 0.0
        explained = min(max(explained, 0.0), 1.0) if math.isfinite(explained) else 0.0
        self._conf = self.decay * self._conf + (1 - self.decay) * explained if self._observed else explained
        self._observed += 1
        return stats

    def skip(self, tracked: list[list[float]]) -> None:
        self._avg_sq = [row[-1] for row in tracked]  # the average did not move: its norm is the one to keep

    def _statistics(self, tracked: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
        """``||delta||^2``, ``||m||^2`` and ``<delta, m>`` per group from :meth:`track`'s norms, by
        ``||m'||^2 = d^2 ||m||^2 + 2 d (1 - d) <delta, m> + (1 - d)^2 ||delta||^2``."""
        d = self.decay
        actual_sq, new_sq = [row[0] for row in tracked], [row[-1] for row in tracked]
        avg_sq = [row[1] for row in tracked] if len(tracked[0]) == 3 else self._avg_sq
        dots = [(n - d * d * m - (1 - d) ** 2 * a) / (2 * d * (1 - d)) for a, m, n in zip(actual_sq, avg_sq, new_sq)]
        self._avg_sq = new_sq
        return actual_sq, avg_sq, dots

    def _clip_scale(self, value: float) -> float:
        return min(max(value, 0.0), self.max_scale) if math.isfinite(value) else 0.0

    def plan(self, horizon: int, features: Tensor | None = None) -> Plan:
        level, slope, noise = self._trend.fit()
        scales, changes = self._trajectory(features, horizon)
        loss, upper, total, drift = [], [], level, 0.0
        for h, change in enumerate(changes, start=1):
            total += change
            drift += abs(change)
            loss.append(total)
            upper.append(total + self.bound_sigmas * (noise + max(drift, abs(slope) * h)))
        scales = [[self._clip_scale(s) for s in row] for row in scales]
        return Plan(scales=scales, loss=loss, loss_upper=upper, confidence=self.confidence())

    def directions(self) -> TensorGroups:
        return self._avg

    # -- state -----------------------------------------------------------------------------------------------
    def release(self) -> None:
        """The update averages (one parameter copy) wait in host memory between fits."""
        self._avg = [[t.to("cpu") for t in group] for group in self._avg]

    def state_dict(self) -> dict[str, Any]:
        return {
            "avg": [[t.detach().clone() for t in group] for group in self._avg],
            "conf": self._conf,
            "observed": self._observed,
            "trend": self._trend.state_dict(),
            "extra": self._extra_state(),
            "avg_sq": self._avg_sq,  # the kept ||m||^2: updates folded in but not learnt yet rely on it
            "tracked": self._tracked,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._avg:
            self._pending = state
            return
        shapes = [[tuple(t.shape) for t in g] for g in self._avg]
        saved = [[tuple(t.shape) for t in g] for g in state["avg"]]
        if shapes != saved:
            raise ValueError(
                f"{type(self).__name__}: checkpointed update averages have shapes {saved}, the model has {shapes}"
            )
        with torch.no_grad():
            for dst, src in zip(self._avg, state["avg"]):
                torch._foreach_copy_(dst, [s.to(d.device) for s, d in zip(src, dst)])
        # kept ||m||^2 (checkpoints before it was kept: measured on the next observed step)
        self._avg_sq, self._tracked = state.get("avg_sq"), bool(state.get("tracked", False))
        self._conf, self._observed = float(state["conf"]), int(state["observed"])
        self._trend.load_state_dict(state["trend"])
        self._load_extra_state(state["extra"])
