"""``rssm``: an ensemble of RSSM-lite world models of the training dynamics (after DreamerV3).

Each member has a GRU deterministic state and a categorical stochastic state. It filters the stream of encoded
training states with its posterior and decodes, per step, the update scale of each parameter group and the loss
change. A Predict segment is a multi-step rollout with the prior. The members disagree where the run has not been
seen before, and that disagreement lowers the confidence.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hybrid.predictors.learned import LearnedPredictor
from lightning_hybrid.validation import check_float, check_int


class _Member(nn.Module):
    def __init__(self, feature_dim: int, outputs: int, hidden: int, categoricals: int, classes: int) -> None:
        super().__init__()
        self.categoricals, self.classes = categoricals, classes
        latent = categoricals * classes
        self.embed = nn.Sequential(nn.Linear(feature_dim, hidden), nn.Tanh())
        self.gru = nn.GRUCell(latent, hidden)
        self.prior = nn.Linear(hidden, latent)
        self.posterior = nn.Linear(2 * hidden, latent)
        self.decode = nn.Sequential(nn.Linear(hidden + latent, hidden), nn.Tanh(), nn.Linear(hidden, outputs))

    def logits(self, layer: nn.Module, x: Tensor) -> Tensor:
        return layer(x).view(*x.shape[:-1], self.categoricals, self.classes)

    def step(self, h: Tensor, z: Tensor, x: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Advance the GRU with the previous latent; return state, prior logits and posterior logits."""
        h = self.gru(z, h)
        prior = self.logits(self.prior, h)
        post = self.logits(self.posterior, torch.cat([h, self.embed(x)], -1)) if x is not None else None
        return h, prior, post


def _sample(logits: Tensor, noise: Tensor) -> Tensor:
    """Straight-through Gumbel-max sample, flattened to one vector per row."""
    probs = logits.softmax(-1)
    onehot = F.one_hot((logits - torch.log(-torch.log(noise))).argmax(-1), logits.shape[-1]).float()
    return (onehot + probs - probs.detach()).flatten(-2)


class RSSMPredictor(LearnedPredictor):
    """Ensemble of RSSM-lite models trained online on windows of the run's own history.

    Args:
        ensemble: number of members (>= 1); their disagreement is the uncertainty.
        categoricals: categorical latent variables per member.
        classes: classes per categorical variable.
        window: length of the training windows (the first quarter is burn-in).
        kl_weight: weight of the KL term between posterior and prior.
        free_nats: KL below this many nats is not penalised (DreamerV3's free bits), so the posterior keeps the
            information the decoder needs.
        **kwargs: the settings of :class:`LearnedPredictor` and :class:`DirectionPredictor`.
    """

    name = "rssm"

    def __init__(
        self,
        ensemble: int = 3,
        categoricals: int = 4,
        classes: int = 4,
        window: int = 16,
        kl_weight: float = 0.1,
        free_nats: float = 1.0,
        lr: float = 3e-2,
        train_every: int = 16,
        batch_size: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(lr=lr, train_every=train_every, batch_size=batch_size, **kwargs)
        owner = "RSSMPredictor"
        self.ensemble = check_int(owner, "ensemble", ensemble, 1)
        self.categoricals = check_int(owner, "categoricals", categoricals, 1)
        self.classes = check_int(owner, "classes", classes, 2)
        self.window = check_int(owner, "window", window, 4)
        self.kl_weight = check_float(owner, "kl_weight", kl_weight, 0.0)
        self.free_nats = check_float(owner, "free_nats", free_nats, 0.0)
        if self.window > self.buffer_size:
            raise ValueError(f"RSSMPredictor: `window` must be <= buffer_size ({self.buffer_size}), got {window}")
        self._h = torch.empty(0)
        self._z = torch.empty(0)
        self._uncertainty = 0.0

    def _make_model(self, feature_dim: int, outputs: int) -> nn.Module:
        members = [
            _Member(feature_dim, outputs, self.hidden, self.categoricals, self.classes) for _ in range(self.ensemble)
        ]
        return nn.ModuleList(members)

    def _build(self, num_groups: int, feature_dim: int, device: torch.device) -> None:
        super()._build(num_groups, feature_dim, device)
        self._h = torch.zeros(self.ensemble, self.hidden, device=device)
        self._z = torch.zeros(self.ensemble, self.categoricals * self.classes, device=device)

    def _decode(self, member: _Member, h: Tensor, z: Tensor) -> Tensor:
        out = member.decode(torch.cat([h, z], -1))
        return torch.cat([torch.sigmoid(out[..., :-1]) * self.max_scale, out[..., -1:]], -1)

    # -- training --------------------------------------------------------------------------------------------
    def _training_loss(self) -> Tensor:
        n = min(self._rows, self.buffer_size)
        length = min(self.window, n)
        burn_in = length // 4
        xs, ys = self._ordered()
        total = torch.zeros((), device=self.device)
        for member in self.model:
            starts = self._randint(n - length + 1, self.batch_size)  # each member its own bootstrap windows
            idx = starts[:, None] + torch.arange(length, device=self.device)
            x, y = xs[idx], ys[idx]
            h = torch.zeros(self.batch_size, self.hidden, device=self.device)
            z = torch.zeros(self.batch_size, self.categoricals * self.classes, device=self.device)
            noise = torch.rand(length, self.batch_size, self.categoricals, self.classes, generator=self.generator)
            noise = noise.clamp_min(1e-9).to(self.device)
            for t in range(length):
                h, prior, post = member.step(h, z, x[:, t])
                z = _sample(post, noise[t])
                if t < burn_in:
                    continue
                total = total + F.mse_loss(self._decode(member, h, z), y[:, t])
                kl = (post.softmax(-1) * (post.log_softmax(-1) - prior.log_softmax(-1))).sum((-2, -1))
                total = total + self.kl_weight * kl.clamp_min(self.free_nats).mean()  # free bits
        return total / (self.ensemble * (length - burn_in))

    def _learn(self, features: Tensor | None, dots: list[float], avg_sq: list[float], loss_change: float) -> None:
        super()._learn(features, dots, avg_sq, loss_change)
        with torch.no_grad():  # filter the new observation into every member's state
            x = self._features(features)
            for i, member in enumerate(self.model):
                h, _, post = member.step(self._h[i : i + 1], self._z[i : i + 1], x[None])
                self._h[i], self._z[i] = h[0], post.softmax(-1).flatten(-2)[0]

    # -- prediction ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _rollout(self, features: Tensor | None, horizon: int) -> Tensor:
        """Predicted ``(members, horizon, groups + 1)`` outputs: the first step from the posterior of the current
        state, the rest from the prior."""
        self.model.eval()
        x = self._features(features)[None]
        out = []
        for i, member in enumerate(self.model):
            h, _, post = member.step(self._h[i : i + 1], self._z[i : i + 1], x)
            z = post.softmax(-1).flatten(-2)
            steps = [self._decode(member, h, z)[0]]
            for _ in range(horizon - 1):
                h, prior, _ = member.step(h, z, None)
                z = prior.softmax(-1).flatten(-2)
                steps.append(self._decode(member, h, z)[0])
            out.append(torch.stack(steps))
        return torch.stack(out)

    def _scales(self, features: Tensor | None) -> list[float]:
        pred = self._rollout(features, 1)
        self._uncertainty = pred.std(0, unbiased=False).mean().item() if self.ensemble > 1 else 0.0
        return pred.mean(0)[0, :-1].tolist()

    def uncertainty(self) -> float:
        return self._uncertainty

    def _trajectory(self, features: Tensor | None, horizon: int) -> tuple[list[list[float]], list[float]]:
        pred = self._rollout(features, horizon + 1)
        self._uncertainty = pred.std(0, unbiased=False).mean().item() if self.ensemble > 1 else 0.0
        mean = pred.mean(0)
        _, _, noise = self._trend.fit()
        return mean[:horizon, :-1].tolist(), (mean[:, -1] * noise).tolist()

    def _extra_state(self) -> dict[str, Any]:
        return {**super()._extra_state(), "h": self._h.clone(), "z": self._z.clone(), "uncertainty": self._uncertainty}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        self._h.copy_(state["h"])
        self._z.copy_(state["z"])
        self._uncertainty = float(state["uncertainty"])
