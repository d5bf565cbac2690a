"""StateEncoder: the training state as a fixed-size, normalised feature vector.

Learned predictors, the residual corrector and the horizon bandit all condition on it. It is built from scalars
the engine already has each ordinary step (losses, the gradient norm, per-group update norms from fused
``torch._foreach_norm`` reductions, learning rates, prediction errors), so encoding costs no extra pass over the
parameters.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_hybrid.settings import Int, Settings, check_float, check_int, setting
from lightning_hybrid.stats import LossTrend

GLOBAL_FEATURES = (
    "loss",
    "loss_slope",
    "loss_noise",
    "grad_norm",
    "grad_norm_trend",
    "lr",
    "step",
    "update_norm",
    "prediction_error",
    "prediction_error_avg",
    "loss_residual",
)
GROUP_FEATURES = ("update_norm", "lr", "update_norm_trend")
VAR_FLOOR = 1e-4  # on the symlog scale: a feature that never moved is not blown up by rounding noise


MIN_DIM = len(GLOBAL_FEATURES) + len(GROUP_FEATURES)  # the global features and one group's


@dataclass(eq=False)
class Encoding(Settings):
    """The state encoding the per-step predictors condition on: the ``DynamicsPredictor``'s own setting."""

    owner = "DynamicsPredictor"

    feature_dim: int = setting(
        64, "length of the encoded training state the per-step predictors condition on", Int(MIN_DIM)
    )


def symlog(x: float) -> float:
    """Sign-preserving log scale: keeps 0 at 0 and turns 1e30 into about 69."""
    return math.copysign(math.log1p(abs(x)), x)


class StateEncoder:
    """Encodes recent training statistics into ``dim`` features, each standardised by running statistics.

    Raw values are put on a log scale (:func:`symlog`), standardised with exponential moving statistics, clipped to
    ``[-clip, clip]`` and zero-padded to ``dim``. Parameter groups beyond the slots ``dim`` leaves are averaged
    into the last slot. Non-finite inputs encode as 0 and do not touch the statistics, so every output is finite.

    Args:
        dim: length of the feature vector (at least the global features plus one group).
        window: recent losses used for level, slope and noise.
        stats_decay: memory of the standardisation statistics, in ``[0, 1)``.
        clip: bound on each standardised feature (> 0).
    """

    def __init__(self, dim: int = 64, window: int = 32, stats_decay: float = 0.99, clip: float = 5.0) -> None:
        owner = "StateEncoder"
        self.dim = check_int(owner, "dim", dim, MIN_DIM)
        self.window = check_int(owner, "window", window, 3)
        self.stats_decay = check_float(owner, "stats_decay", stats_decay, 0.0, 1.0, open_high=True)
        self.clip = check_float(owner, "clip", clip, 0.0, open_low=True)
        self.max_groups = (dim - len(GLOBAL_FEATURES)) // len(GROUP_FEATURES)
        self._trend = LossTrend(window)
        self._grad = {"fast": math.nan, "slow": math.nan}
        self._updates: list[float] = []
        self._update_slow: list[float] = []
        self._errors: deque[float] = deque(maxlen=window)
        self._raw = [0.0] * dim
        self._mean = [0.0] * dim
        self._var = [0.0] * dim
        self._count = 0

    def observe_loss(self, step: int, loss: float, grad_norm: float) -> None:
        """Record one ordinary step's loss and gradient norm only: what keeps the loss trend and gradient averages
        current while the plugin is backed off, without the cost of refreshing the features."""
        if math.isfinite(loss):
            self._trend.add(step, loss)
        if math.isfinite(grad_norm):
            for key, decay in (("fast", 0.5), ("slow", 0.95)):
                old = self._grad[key]
                self._grad[key] = grad_norm if math.isnan(old) else decay * old + (1 - decay) * grad_norm

    def observe(
        self,
        step: int,
        loss: float,
        grad_norm: float,
        lrs: Sequence[float],
        update_sq: Sequence[float] | None = None,
        prediction_error: float | None = None,
        loss_residual: float | None = None,
    ) -> None:
        """Record one ordinary step and refresh the features and their running statistics."""
        self.observe_loss(step, loss, grad_norm)
        if update_sq is not None:
            norms = [math.sqrt(max(v, 0.0)) if math.isfinite(v) else math.nan for v in update_sq]
            if len(self._update_slow) != len(norms):
                self._update_slow = list(norms)
            self._update_slow = [n if math.isnan(s) else 0.95 * s + 0.05 * n for s, n in zip(self._update_slow, norms)]
            self._updates = norms
        if prediction_error is not None and math.isfinite(prediction_error):
            self._errors.append(prediction_error)
        level, slope, noise = self._trend.fit() if len(self._trend) else (math.nan, 0.0, 0.0)
        scale = abs(level) + 1e-12
        total_update = math.sqrt(sum(u * u for u in self._updates if math.isfinite(u)))
        globals_ = [
            level,
            slope / scale,
            noise / scale,
            self._grad["fast"],
            self._grad["fast"] / (self._grad["slow"] + 1e-12),
            lrs[0] if lrs else 0.0,
            float(step),
            total_update,
            self._errors[-1] if self._errors else 0.0,
            sum(self._errors) / len(self._errors) if self._errors else 0.0,
            (loss_residual / (noise + 1e-12)) if loss_residual is not None and math.isfinite(loss_residual) else 0.0,
        ]
        groups = [[u, lr, u / (s + 1e-12)] for u, lr, s in zip(self._updates, list(lrs) or [0.0], self._update_slow)]
        if len(groups) > self.max_groups:  # fold the surplus groups into the last slot
            tail = groups[self.max_groups - 1 :]
            groups = [*groups[: self.max_groups - 1], [sum(col) / len(tail) for col in zip(*tail)]]
        raw = globals_ + [v for g in groups for v in g]
        self._raw = [symlog(v) if math.isfinite(v) else math.nan for v in raw] + [0.0] * (self.dim - len(raw))
        self._update_stats()

    def _update_stats(self) -> None:
        d = self.stats_decay
        warm = self._count < 1.0 / (1.0 - d)  # plain averages until the moving window is full
        rate = 1.0 / (self._count + 1) if warm else 1.0 - d
        for i, x in enumerate(self._raw):
            if math.isnan(x):
                continue
            delta = x - self._mean[i]
            self._mean[i] += rate * delta
            self._var[i] = (1 - rate) * (self._var[i] + rate * delta * delta)
        self._count += 1

    def loss_trend(self) -> tuple[float, float, float]:
        """Level, slope per step and noise of the recent ordinary-step losses."""
        return self._trend.fit()

    def features(self) -> torch.Tensor:
        """The current feature vector (float32, CPU, shape ``(dim,)``), all entries finite and in ±clip."""
        out = []
        for x, m, v in zip(self._raw, self._mean, self._var):
            z = (x - m) / math.sqrt(v + VAR_FLOOR) if math.isfinite(x) else 0.0
            out.append(min(max(z, -self.clip), self.clip) if math.isfinite(z) else 0.0)
        return torch.tensor(out, dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return {
            "trend": self._trend.state_dict(),
            "grad": dict(self._grad),
            "updates": list(self._updates),
            "update_slow": list(self._update_slow),
            "errors": list(self._errors),
            "raw": list(self._raw),
            "mean": list(self._mean),
            "var": list(self._var),
            "count": self._count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["raw"]) != self.dim:
            raise ValueError(f"StateEncoder: checkpoint has {len(state['raw'])} features, this encoder {self.dim}")
        self._trend.load_state_dict(state["trend"])
        self._grad = dict(state["grad"])
        self._updates, self._update_slow = list(state["updates"]), list(state["update_slow"])
        self._errors = deque(state["errors"], maxlen=self.window)
        self._raw, self._mean, self._var = list(state["raw"]), list(state["mean"]), list(state["var"])
        self._count = int(state["count"])
