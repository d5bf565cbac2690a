"""LearnedPredictor: online training of a tiny model on the run's own observations.

Each ordinary step adds one row ``(features, targets)`` to a replay buffer on the training device; every
``train_every`` steps the model takes one optimizer step on a sampled batch. Targets per step are the
least-squares scale of the actual update on the tracked direction (per parameter group, clipped to
``[0, max_scale]``) and the loss change in loss-noise units. The model, its optimizer, the buffer and the random
generator are all checkpointed, so resumed runs continue exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_hybrid.predictors.direction import DirectionPredictor
from lightning_hybrid.settings import Float, Int, setting


@dataclass(eq=False)
class LearnedPredictor(DirectionPredictor):
    """Base of predictors whose magnitudes come from a small network trained online."""

    hidden: int = setting(32, "width of the hidden layers (and of the GRU state)", Int(1))
    lr: float = setting(3e-3, "Adam learning rate of the online training", Float(0.0, open_low=True))
    buffer_size: int = setting(512, "replay buffer, in observed ordinary steps", Int(2))
    batch_size: int = setting(32, "rows (`mlp`) or windows per member (`rssm`) per training step", Int(1))
    train_every: int = setting(
        4, "observed steps between training steps; this is what keeps the cost within 3% of a step", Int(1)
    )
    seed: int = setting(
        0, "seed of the predictor's own generator (initialisation, sampling), independent of the run's", Int(0)
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.generator = torch.Generator().manual_seed(self.seed)
        self._x = torch.empty(0)
        self._y = torch.empty(0)
        self._rows = 0  # rows ever written; the buffer holds the last ``buffer_size``
        self.train_steps = 0

    # -- for subclasses --------------------------------------------------------------------------------------
    def _make_model(self, feature_dim: int, outputs: int) -> nn.Module:
        raise NotImplementedError

    def _training_loss(self) -> Tensor:
        raise NotImplementedError

    # -- shared machinery ------------------------------------------------------------------------------------
    def _build(self, num_groups: int, feature_dim: int, device: torch.device) -> None:
        self.num_groups = num_groups
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.model = self._make_model(feature_dim, num_groups + 1).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        self._x = torch.zeros(self.buffer_size, feature_dim, device=device)
        self._y = torch.zeros(self.buffer_size, num_groups + 1, device=device)
        self._rows = 0

    @property
    def device(self) -> torch.device:
        return self._x.device

    def _features(self, features: Tensor | None) -> Tensor:
        if features is None:
            return torch.zeros(self._x.shape[1], device=self.device)
        return features.to(self.device, torch.float32)

    def _learn(self, features: Tensor | None, dots: list[float], avg_sq: list[float], loss_change: float) -> None:
        targets = [self._clip_scale(d / m) if m > 0 else 0.0 for d, m in zip(dots, avg_sq)] + [loss_change]
        slot = self._rows % self.buffer_size
        self._x[slot] = self._features(features)
        self._y[slot] = torch.tensor(targets, device=self.device)
        self._rows += 1
        if self._rows >= self.batch_size and self._rows % self.train_every == 0:
            self.model.train()
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._training_loss()
            loss.backward()
            self.optimizer.step()
            self.train_steps += 1

    def _ordered(self) -> tuple[Tensor, Tensor]:
        """Buffer rows oldest first."""
        n = min(self._rows, self.buffer_size)
        if self._rows <= self.buffer_size:
            return self._x[:n], self._y[:n]
        start = self._rows % self.buffer_size
        order = torch.cat([torch.arange(start, n), torch.arange(0, start)]).to(self.device)
        return self._x[order], self._y[order]

    def _randint(self, high: int, size: int) -> Tensor:
        return torch.randint(high, (size,), generator=self.generator).to(self.device)

    def _extra_state(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),  # its tensors are live otherwise
            "x": self._x.clone(),
            "y": self._y.clone(),
            "rows": self._rows,
            "train_steps": self.train_steps,
            "generator": self.generator.get_state(),
        }

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if tuple(state["y"].shape) != tuple(self._y.shape) or tuple(state["x"].shape) != tuple(self._x.shape):
            raise ValueError(
                f"{type(self).__name__}: checkpointed replay buffer has shape {tuple(state['x'].shape)} / "
                f"{tuple(state['y'].shape)}, this run needs {tuple(self._x.shape)} / {tuple(self._y.shape)}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._x.copy_(state["x"])
        self._y.copy_(state["y"])
        self._rows, self.train_steps = int(state["rows"]), int(state["train_steps"])
        self.generator.set_state(state["generator"])
