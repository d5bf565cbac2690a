"""LinUCBHorizons: LinUCB over Predict horizons, including "don't predict" (arm 0), in plain torch (the
:class:`~lightning_hybrid.HorizonBandit` callback holds one and checkpoints it)."""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.settings import Choice, Float, Int, Ints, Settings, setting

WALL_COST = (
    "HorizonBandit: cost='wall' charges each step its measured seconds, so which horizons are played, and the "
    "weights a run ends with, depend on how busy the machine is: two runs with the same seed differ, and so does a "
    "resume. cost='steps' (the default) reads no clock."
)


@dataclass(eq=False)
class LinUCBHorizons(Settings):
    """Chooses how many steps to predict after each Full cycle, learning from the progress it buys.

    A contextual bandit (LinUCB, one ridge regression per arm on the state features plus a bias) over horizon
    arms. Arm 0 means "another Full cycle" and defines the baseline: its reward is known to be 0, so it gets no
    exploration bonus. A Predict arm is explored ``exploration_plays`` times while its upper confidence bound is
    above 0, and afterwards played only while its lower bound is. A Predict arm's reward
    is the training progress it bought (loss level before the segment minus the mean loss over the following
    Correct steps) beyond what ordinary steps would have made at the rate just measured, for the same cost:
    ``(progress - rate * cost) / (|rate| * cost + noise)``, where ``noise`` is the uncertainty of the measured
    mean loss; clipped to ``±reward_clip``. A rolled-back segment earns ``rollback_penalty``. When prediction does
    not pay, arm 0 wins and training backs off to plain steps.
    """

    owner = "HorizonBandit"  # the name users configure it by

    arms: tuple[int, ...] = setting(
        (0, 2, 4, 8, 16, 32),
        "candidate horizons; those above `max_predict_steps` are dropped, 0 and `max_predict_steps` are always arms",
        Ints(0),
    )
    alpha: float = setting(1.5, "width of the upper confidence bound (exploration)", Float(0.0))
    ridge: float = setting(1.0, "ridge regularisation of each arm's regression", Float(0.0, open_low=True))
    rollback_penalty: float = setting(-3.0, "reward of a rolled-back segment", Float(-math.inf, 0.0))
    reward_clip: float = setting(3.0, "bound on a reward's magnitude", Float(0.0, open_low=True))
    cost: str = setting(
        "steps",
        "`steps`: an ordinary step costs 1, a predicted one `predict_cost`, so the same run makes the same choices "
        "on any machine under any load, and resumes exactly; `wall`: a step costs its measured seconds, so the "
        "choices (and the weights) depend on how busy the machine is (warned about)",
        Choice(("steps", "wall")),
    )
    predict_cost: float = setting(0.3, 'relative cost of a predicted step for `cost="steps"`', Float(0.0, 1.0))
    baseline_window: int = setting(5, "Full-step losses averaged for the loss before a segment", Int(1))
    exploration_plays: int = setting(
        2,
        "plays of each Predict arm scored optimistically (upper bound); after them an arm is played only while the "
        "lower bound of its reward is above 0, so prediction has to prove that it pays",
        Int(0),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cost == "wall":
            warnings.warn(WALL_COST, stacklevel=3)
        self.horizons: list[int] = []  # the arms played, once set up for the run's ``max_predict_steps``
        self.counts: list[int] = []
        self.rewards: list[float] = []
        self._a = torch.empty(0)
        self._b = torch.empty(0)
        self.unit_cost = math.nan  # cost of an ordinary step (moving average)
        self._recent: deque[float] = deque(maxlen=self.baseline_window)  # losses of the last ordinary (Full) steps
        self.episode: dict[str, Any] | None = None

    def setup_arms(self, max_predict_steps: int, feature_dim: int) -> None:
        """Fix the arms and allocate the regressions (kept if already set up for the same shape)."""
        arms = sorted({a for a in self.arms if a <= max_predict_steps} | {0, max_predict_steps})
        d = feature_dim + 1
        if arms == self.horizons and self._a.shape == (len(arms), d, d):
            return
        self.horizons = arms
        self.counts = [0] * len(arms)
        self.rewards = [0.0] * len(arms)
        self._a = torch.eye(d, dtype=torch.float64).repeat(len(arms), 1, 1) * self.ridge
        self._b = torch.zeros(len(arms), d, dtype=torch.float64)

    @staticmethod
    def _context(features: Tensor) -> Tensor:
        """Features scaled to about unit norm, plus a bias: an arm's average reward is learned through the bias
        after a few plays, and the state features refine it (unscaled, standardised features in 64 dimensions
        make contexts nearly orthogonal, so nothing learned in one state would carry over to the next)."""
        x = features.detach().double().cpu() / max(features.numel(), 1) ** 0.5
        return torch.cat([x, torch.ones(1, dtype=torch.float64)])

    def scores(self, features: Tensor) -> list[float]:
        """Upper confidence bound of each arm's reward in this state; arm 0, the baseline, is known to be 0."""
        x = self._context(features)
        theta = torch.linalg.solve(self._a, self._b)
        spread = torch.linalg.solve(self._a, x.expand(len(self.horizons), -1)) @ x
        mean, width = (theta @ x).tolist(), (self.alpha * spread.clamp_min(0).sqrt()).tolist()
        return [
            0.0 if arm == 0 else m + w if n < self.exploration_plays else m - w
            for arm, n, m, w in zip(self.horizons, self.counts, mean, width)
        ]

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

    def relative_reward(self, progress: float, cost: float, rate: float, noise: float = 0.0) -> float:
        """Progress of a segment beyond what ordinary steps at ``rate`` progress per cost would have made, in
        units of that expected progress plus ``noise``, the uncertainty of the progress measurement."""
        if not (math.isfinite(progress) and math.isfinite(rate)) or cost <= 0:
            return -self.reward_clip
        noise = noise if math.isfinite(noise) else 0.0
        return (progress - rate * cost) / (abs(rate) * cost + noise + 1e-12)

    # -- episodes: one played Predict arm, from its decision to the end of the following Correct steps -----------
    def record_step(self, predicted: bool, seconds: float, loss: float | None, correcting: bool) -> None:
        """Account one finished step: its cost, and (in Correct steps of an episode) its loss."""
        cost = seconds if self.cost == "wall" else self.predict_cost if predicted else 1.0
        if not predicted and not correcting:
            self.unit_cost = cost if math.isnan(self.unit_cost) else 0.9 * self.unit_cost + 0.1 * cost
            if loss is not None and math.isfinite(loss):
                self._recent.append(loss)
        if self.episode is not None:
            self.episode["cost"] += cost
            if correcting and loss is not None and math.isfinite(loss):
                self.episode["losses"].append(loss)

    def begin(self, arm: int, features: Tensor, loss_slope: float, loss_noise: float) -> None:
        """A Predict arm was played in a state whose loss falls by ``-loss_slope`` per ordinary step, with
        batch-to-batch noise ``loss_noise``."""
        unit = self.unit_cost if math.isfinite(self.unit_cost) and self.unit_cost > 0 else 1.0
        before = list(self._recent)
        self.episode = {
            "arm": arm,
            "features": features.detach().float().cpu(),
            "level": sum(before) / len(before) if before else math.nan,
            "window": len(before),
            "rate": -loss_slope / unit,
            "noise": loss_noise,
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
        n = len(ep["losses"])
        after = sum(ep["losses"]) / n
        # from the centre of the losses before (averaged over `window` Full steps) to the centre of those after
        cost = ep["cost"] + (ep["window"] - n) / 2 * ep["unit"]
        noise = ep["noise"] * math.sqrt(1 / max(ep["window"], 1) + 1 / n)  # uncertainty of the two means
        reward = self.relative_reward(ep["level"] - after, cost, ep["rate"], noise)
        self.update(ep["arm"], ep["features"], reward)
        return reward

    def abort(self) -> None:
        """The episode's segment was rolled back."""
        if self.episode is not None:
            ep, self.episode = self.episode, None
            self.update(ep["arm"], ep["features"], self.rollback_penalty)

    def state_dict(self) -> dict[str, Any]:
        return {
            "arms": list(self.horizons),
            "counts": list(self.counts),
            "rewards": list(self.rewards),
            "a": self._a.clone(),
            "b": self._b.clone(),
            "unit_cost": self.unit_cost,
            "recent": list(self._recent),
            "episode": {**self.episode, "losses": list(self.episode["losses"])} if self.episode else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.horizons, self.counts, self.rewards = list(state["arms"]), list(state["counts"]), list(state["rewards"])
        self._a, self._b = state["a"].clone(), state["b"].clone()
        self.unit_cost = float(state["unit_cost"])
        self._recent = deque(state["recent"], maxlen=self.baseline_window)
        episode = state["episode"]
        self.episode = {**episode, "losses": list(episode["losses"])} if episode is not None else None
