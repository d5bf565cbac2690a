"""HorizonBandit: LinUCB over Predict horizons, including "don't predict" (arm 0)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.validation import check_choice, check_float


class HorizonBandit(HybridComponent):
    """Chooses how many steps to predict after each Full cycle, learning from the progress it buys.

    A contextual bandit (LinUCB, one ridge regression per arm on the state features plus a bias) over horizon
    arms. Arm 0 means "another Full cycle" and defines the baseline: its reward is 0. A Predict arm's reward is
    the training progress it bought (loss before the segment minus the mean loss over the following Correct
    steps) per unit of cost, relative to the progress ordinary steps made per unit of cost just before:
    ``(progress - rate * cost) / (|rate| * cost)``, clipped to ``±reward_clip``. A rolled-back segment earns
    ``rollback_penalty``. When prediction does not pay, arm 0 wins and training backs off to plain steps.

    Args:
        arms: candidate horizons; those above ``max_predict_steps`` are dropped, ``max_predict_steps`` and 0
            are always arms.
        alpha: width of the upper confidence bound (exploration).
        ridge: ridge regularisation of each arm's regression (> 0).
        rollback_penalty: reward of a rolled-back segment (<= 0).
        reward_clip: bound on the magnitude of a reward (> 0).
        cost: ``"wall"`` measures cost in seconds of step time; ``"steps"`` counts an ordinary step as 1 and a
            predicted step as ``predict_cost``, which is deterministic (exact resume does not depend on timing).
        predict_cost: cost of a predicted step relative to an ordinary one, for ``cost="steps"``.
    """

    def __init__(
        self,
        arms: Sequence[int] = (0, 2, 4, 8, 16, 32),
        alpha: float = 0.5,
        ridge: float = 1.0,
        rollback_penalty: float = -3.0,
        reward_clip: float = 3.0,
        cost: str = "wall",
        predict_cost: float = 0.3,
    ) -> None:
        owner = "HorizonBandit"
        if not arms or any(isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in arms):
            raise ValueError(f"{owner}: `arms` must be a non-empty list of integers >= 0, got {arms!r}")
        self.arms_requested = tuple(arms)
        self.alpha = check_float(owner, "alpha", alpha, 0.0)
        self.ridge = check_float(owner, "ridge", ridge, 0.0, open_low=True)
        self.rollback_penalty = check_float(owner, "rollback_penalty", rollback_penalty, -math.inf, 0.0)
        self.reward_clip = check_float(owner, "reward_clip", reward_clip, 0.0, open_low=True)
        self.cost = check_choice(owner, "cost", cost, ("wall", "steps"))
        self.predict_cost = check_float(owner, "predict_cost", predict_cost, 0.0, 1.0)
        self.arms: list[int] = []
        self.counts: list[int] = []
        self.rewards: list[float] = []
        self._a = torch.empty(0)
        self._b = torch.empty(0)
        self.unit_cost = math.nan  # cost of an ordinary step (moving average)
        self.episode: dict[str, Any] | None = None

    def setup_arms(self, max_predict_steps: int, feature_dim: int) -> None:
        """Fix the arms and allocate the regressions (kept if already set up for the same shape)."""
        arms = sorted({a for a in self.arms_requested if a <= max_predict_steps} | {0, max_predict_steps})
        d = feature_dim + 1
        if arms == self.arms and self._a.shape == (len(arms), d, d):
            return
        self.arms = arms
        self.counts = [0] * len(arms)
        self.rewards = [0.0] * len(arms)
        self._a = torch.eye(d, dtype=torch.float64).repeat(len(arms), 1, 1) * self.ridge
        self._b = torch.zeros(len(arms), d, dtype=torch.float64)

    @staticmethod
    def _context(features: Tensor) -> Tensor:
        return torch.cat([features.detach().double().cpu(), torch.ones(1, dtype=torch.float64)])

    def scores(self, features: Tensor) -> list[float]:
        """Upper confidence bound of each arm's reward in this state."""
        x = self._context(features)
        theta = torch.linalg.solve(self._a, self._b)
        spread = torch.linalg.solve(self._a, x.expand(len(self.arms), -1)) @ x
        return (theta @ x + self.alpha * spread.clamp_min(0).sqrt()).tolist()

    def choose(self, features: Tensor) -> int:
        """Index of the arm to play (ties go to the shorter horizon)."""
        scores = self.scores(features)
        return max(range(len(scores)), key=lambda i: (scores[i], -i))

    def update(self, arm: int, features: Tensor, reward: float) -> None:
        reward = min(max(reward, -self.reward_clip), self.reward_clip) if math.isfinite(reward) else -self.reward_clip
        x = self._context(features)
        self._a[arm] += torch.outer(x, x)
        self._b[arm] += reward * x
        self.counts[arm] += 1
        self.rewards[arm] += reward

    def relative_reward(self, progress: float, cost: float, rate: float) -> float:
        """Progress of a segment against what ordinary steps at ``rate`` progress per cost would have made."""
        if not (math.isfinite(progress) and math.isfinite(rate)) or cost <= 0:
            return -self.reward_clip
        return (progress - rate * cost) / (abs(rate) * cost + 1e-12)

    # -- episodes: one played Predict arm, from its decision to the end of the following Correct steps -----------
    def record_step(self, predicted: bool, seconds: float, loss: float | None, correcting: bool) -> None:
        """Account one finished step: its cost, and (in Correct steps of an episode) its loss."""
        cost = seconds if self.cost == "wall" else self.predict_cost if predicted else 1.0
        if not predicted and not correcting:
            self.unit_cost = cost if math.isnan(self.unit_cost) else 0.9 * self.unit_cost + 0.1 * cost
        if self.episode is not None:
            self.episode["cost"] += cost
            if correcting and loss is not None and math.isfinite(loss):
                self.episode["losses"].append(loss)

    def begin(self, arm: int, features: Tensor, loss_level: float, loss_slope: float) -> None:
        """A Predict arm was played from a state whose loss trend is ``loss_level`` falling by ``-loss_slope``."""
        unit = self.unit_cost if math.isfinite(self.unit_cost) and self.unit_cost > 0 else 1.0
        self.episode = {
            "arm": arm,
            "features": features.detach().float().cpu(),
            "level": loss_level,
            "rate": -loss_slope / unit,
            "unit": unit,
            "cost": 0.0,
            "losses": [],
        }

    def finish(self) -> float | None:
        """Close the episode after its Correct steps and learn from its reward."""
        if self.episode is None:
            return None
        ep, self.episode = self.episode, None
        if not ep["losses"]:
            return None
        after = sum(ep["losses"]) / len(ep["losses"])
        cost = ep["cost"] - (len(ep["losses"]) - 1) / 2 * ep["unit"]  # up to the centre of the Correct losses
        reward = self.relative_reward(ep["level"] - after, cost, ep["rate"])
        self.update(ep["arm"], ep["features"], reward)
        return reward

    def abort(self) -> None:
        """The episode's segment was rolled back."""
        if self.episode is not None:
            ep, self.episode = self.episode, None
            self.update(ep["arm"], ep["features"], self.rollback_penalty)

    def state_dict(self) -> dict[str, Any]:
        return {
            "arms": list(self.arms),
            "counts": list(self.counts),
            "rewards": list(self.rewards),
            "a": self._a.clone(),
            "b": self._b.clone(),
            "unit_cost": self.unit_cost,
            "episode": {**self.episode, "losses": list(self.episode["losses"])} if self.episode else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arms, self.counts, self.rewards = list(state["arms"]), list(state["counts"]), list(state["rewards"])
        self._a, self._b = state["a"].clone(), state["b"].clone()
        self.unit_cost = float(state["unit_cost"])
        episode = state["episode"]
        self.episode = {**episode, "losses": list(episode["losses"])} if episode is not None else None
