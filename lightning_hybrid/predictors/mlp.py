"""``mlp``: a small MLP maps the encoded training state to per-group update scales and the loss slope."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_hybrid.predictors.learned import LearnedPredictor


class MLPPredictor(LearnedPredictor):
    """Two-layer MLP on the state features, trained online (see :class:`LearnedPredictor`).

    Outputs, per parameter group, the scale of the next update along the tracked direction (a sigmoid times
    ``max_scale``), and the next loss change in noise units. A segment repeats that one-step prediction.
    """

    name = "mlp"

    def _make_model(self, feature_dim: int, outputs: int) -> nn.Module:
        return nn.Sequential(nn.Linear(feature_dim, self.hidden), nn.Tanh(), nn.Linear(self.hidden, outputs))

    def _outputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out = self.model(x)
        return torch.sigmoid(out[..., :-1]) * self.max_scale, out[..., -1]

    def _training_loss(self) -> Tensor:
        n = min(self._rows, self.buffer_size)
        idx = self._randint(n, self.batch_size)
        scales, change = self._outputs(self._x[idx])
        y = self._y[idx]
        return nn.functional.mse_loss(scales, y[:, :-1]) + nn.functional.mse_loss(change, y[:, -1])

    @torch.no_grad()
    def _predict(self, features: Tensor | None) -> tuple[list[float], float]:
        self.model.eval()
        scales, change = self._outputs(self._features(features))
        return scales.tolist(), change.item()

    def _scales(self, features: Tensor | None) -> list[float]:
        return self._predict(features)[0]

    def _trajectory(self, features: Tensor | None, horizon: int) -> tuple[list[list[float]], list[float]]:
        scales, change = self._predict(features)
        _, _, noise = self._trend.fit()
        return [scales] * horizon, [change * noise] * (horizon + 1)
