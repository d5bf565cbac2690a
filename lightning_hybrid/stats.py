"""Small scalar statistics kept as Python floats, so they checkpoint exactly and cost no device syncs; and the
one fused reduction over parameter-shaped tensors they are fed from."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch
from torch import Tensor


def sq_norm(tensors: list[Tensor]) -> Tensor:
    """Sum of squares over a tensor list, as one fused reduction (a 0-d float tensor on their device)."""
    return torch.stack(torch._foreach_norm(tensors)).float().square().sum()


class EmaStats:
    """Exponential moving mean and variance of a scalar stream."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.mean = 0.0
        self.var = 0.0
        self.count = 0

    def update(self, x: float) -> None:
        if self.count == 0:
            self.mean, self.var = x, 0.0
        else:
            delta = x - self.mean
            self.mean += (1.0 - self.decay) * delta
            self.var = self.decay * (self.var + (1.0 - self.decay) * delta * delta)
        self.count += 1

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), int(state["count"])


class LossTrend:
    """Least-squares line through the most recent ``(step, loss)`` points."""

    def __init__(self, window: int) -> None:
        self.points: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, step: int, loss: float) -> None:
        self.points.append((float(step), loss))

    def __len__(self) -> int:
        return len(self.points)

    def fit(self) -> tuple[float, float, float]:
        """Return ``(level at the last step, slope per step, residual std)``."""
        n = len(self.points)
        if n == 0:
            return math.nan, 0.0, math.nan
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
        resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys)]
        std = math.sqrt(sum(r * r for r in resid) / max(n - 2, 1))
        return my + slope * (xs[-1] - mx), slope, std

    def state_dict(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self.points], "window": self.points.maxlen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = deque((tuple(p) for p in state["points"]), maxlen=int(state["window"]))
