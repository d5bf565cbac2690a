"""``rssm``: an ensemble of RSSM-lite world models of the training dynamics (after DreamerV3).

Each member has a GRU deterministic state and a categorical stochastic state. It filters the stream of encoded
training states with its posterior and decodes, per step, the update scale of each parameter group and the loss
change. A Predict segment is a multi-step rollout with the prior. The members disagree where the run has not been
seen before, and that disagreement lowers the confidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hybrid.predictors.learned import LearnedPredictor
from lightning_hybrid.settings import Float, Int, redefault, setting


class _Linear(nn.Module):
    """One independent linear layer per ensemble member, applied as a single batched matmul."""

    def __init__(self, ensemble: int, fan_in: int, fan_out: int) -> None:
        super().__init__()
        bound = fan_in**-0.5  # nn.Linear's and nn.GRUCell's initial range
        self.weight = nn.Parameter(torch.empty(ensemble, fan_in, fan_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(ensemble, 1, fan_out).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class _Ensemble(nn.Module):
    """All members at once: every tensor is ``(members, batch, ...)``, so the cost hardly grows with members."""

    def __init__(
        self, ensemble: int, feature_dim: int, outputs: int, hidden: int, categoricals: int, classes: int
    ) -> None:
        super().__init__()
        self.categoricals, self.classes = categoricals, classes
        latent = categoricals * classes
        self.embed = _Linear(ensemble, feature_dim, hidden)
        self.gru_in = _Linear(ensemble, latent, 3 * hidden)
        self.gru_state = _Linear(ensemble, hidden, 3 * hidden)
        self.prior = _Linear(ensemble, hidden, latent)
        self.posterior = _Linear(ensemble, 2 * hidden, latent)
        self.decode_hidden = _Linear(ensemble, hidden + latent, hidden)
        self.decode_out = _Linear(ensemble, hidden, outputs)

    def _logits(self, layer: _Linear, x: Tensor) -> Tensor:
        return layer(x).view(*x.shape[:-1], self.categoricals, self.classes)

    def _gru(self, z: Tensor, h: Tensor) -> Tensor:
        """nn.GRUCell's update, batched over members."""
        in_r, in_u, in_n = self.gru_in(z).chunk(3, -1)
        h_r, h_u, h_n = self.gru_state(h).chunk(3, -1)
        reset, update = torch.sigmoid(in_r + h_r), torch.sigmoid(in_u + h_u)
        return torch.lerp(torch.tanh(in_n + reset * h_n), h, update)

    def step(
        self, h: Tensor, z: Tensor, x: Tensor | None, prior: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Advance the GRU with the previous latent; return the state, the prior logits (if ``prior``) and, given an
        observation ``x``, the posterior logits."""
        h = self._gru(z, h)
        prior_logits = self._logits(self.prior, h) if prior else None
        post = None
        if x is not None:
            post = self._logits(self.posterior, torch.cat([h, torch.tanh(self.embed(x))], -1))
        return h, prior_logits, post

    def decode(self, h: Tensor, z: Tensor) -> Tensor:
        return self.decode_out(torch.tanh(self.decode_hidden(torch.cat([h, z], -1))))


def _sample(logits: Tensor, noise: Tensor) -> Tensor:
    """Straight-through Gumbel-max sample, flattened to one vector per row."""
    probs = logits.softmax(-1)
    onehot = F.one_hot((logits - torch.log(-torch.log(noise))).argmax(-1), logits.shape[-1]).float()
    return (onehot + probs - probs.detach()).flatten(-2)


@dataclass(eq=False)
class RSSMPredictor(LearnedPredictor):
    """Ensemble of RSSM-lite models trained online on windows of the run's own history."""

    name = "rssm"

    lr: float = redefault(LearnedPredictor, "lr", 3e-2)
    batch_size: int = redefault(LearnedPredictor, "batch_size", 16)
    train_every: int = redefault(LearnedPredictor, "train_every", 32)
    ensemble: int = setting(3, "members; their disagreement is the uncertainty", Int(1))
    categoricals: int = setting(4, "categorical latent variables per member", Int(1))
    classes: int = setting(4, "classes per categorical variable", Int(2))
    window: int = setting(16, "training window length, the first quarter burn-in (≤ `buffer_size`)", Int(4))
    kl_weight: float = setting(0.1, "weight of the KL term between posterior and prior", Float(0.0))
    free_nats: float = setting(
        1.0,
        "KL below this many nats is not penalised (DreamerV3's free bits), so the posterior keeps what the decoder "
        "needs",
        Float(0.0),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window > self.buffer_size:
            raise ValueError(f"RSSMPredictor: `window` must be <= buffer_size ({self.buffer_size}), got {self.window}")
        self._h = torch.empty(0)
        self._z = torch.empty(0)
        self._filtered: tuple[Tensor, Tensor] | None = None  # this step's filter state, committed after training
        self._uncertainty = 0.0

    def _make_model(self, feature_dim: int, outputs: int) -> nn.Module:
        return _Ensemble(self.ensemble, feature_dim, outputs, self.hidden, self.categoricals, self.classes)

    def _build(self, num_groups: int, feature_dim: int, device: torch.device) -> None:
        super()._build(num_groups, feature_dim, device)
        self._h = torch.zeros(self.ensemble, 1, self.hidden, device=device)
        self._z = torch.zeros(self.ensemble, 1, self.categoricals * self.classes, device=device)
        self._filtered = None

    def _decode(self, h: Tensor, z: Tensor) -> Tensor:
        out = self.model.decode(h, z)
        return torch.cat([torch.sigmoid(out[..., :-1]) * self.max_scale, out[..., -1:]], -1)

    # -- training --------------------------------------------------------------------------------------------
    def _training_loss(self) -> Tensor:
        n = min(self._rows, self.buffer_size)
        length = min(self.window, n)
        burn_in = length // 4
        xs, ys = self._ordered()
        shape = (self.ensemble, self.batch_size)
        starts = self._randint(n - length + 1, self.ensemble * self.batch_size).view(shape)  # bootstrap per member
        idx = starts[..., None] + torch.arange(length, device=self.device)
        x, y = xs[idx], ys[idx]  # (members, batch, length, ...)
        h = torch.zeros(*shape, self.hidden, device=self.device)
        z = torch.zeros(*shape, self.categoricals * self.classes, device=self.device)
        noise = torch.rand(length, *shape, self.categoricals, self.classes, generator=self.generator)
        noise = noise.clamp_min(1e-9).to(self.device)
        total = torch.zeros((), device=self.device)
        for t in range(length):
            h, prior, post = self.model.step(h, z, x[:, :, t])
            z = _sample(post, noise[t])
            if t < burn_in:
                continue
            total = total + F.mse_loss(self._decode(h, z), y[:, :, t])
            kl = (post.softmax(-1) * (post.log_softmax(-1) - prior.log_softmax(-1))).sum((-2, -1))
            total = total + self.kl_weight * kl.clamp_min(self.free_nats).mean()  # free bits
        return total / (length - burn_in)

    def _learn(self, features: Tensor | None, dots: list[float], avg_sq: list[float], loss_change: float) -> None:
        super()._learn(features, dots, avg_sq, loss_change)
        if self._filtered is not None:  # commit the filter step that ``_scales`` computed for this observation
            self._h, self._z = self._filtered
            self._filtered = None

    # -- prediction ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _rollout(self, features: Tensor | None, horizon: int) -> tuple[Tensor, Tensor, Tensor]:
        """Predicted ``(members, horizon, groups + 1)`` outputs, the first step from the posterior of the current
        state, the rest from the prior; also the filtered state after the first step."""
        self.model.eval()
        x = self._features(features).expand(self.ensemble, 1, -1)
        h, _, post = self.model.step(self._h, self._z, x, prior=False)
        z = post.softmax(-1).flatten(-2)
        filtered = (h, z)
        steps = [self._decode(h, z)]
        for _ in range(horizon - 1):
            h, prior, _ = self.model.step(h, z, None)
            z = prior.softmax(-1).flatten(-2)
            steps.append(self._decode(h, z))
        return torch.cat(steps, 1), *filtered

    def _summarise(self, pred: Tensor) -> Tensor:
        """Ensemble mean per step and output, with the disagreement appended as a last row (one host sync)."""
        spread = pred.std(0, unbiased=False).mean() if self.ensemble > 1 else pred.new_zeros(())
        mean = pred.mean(0)
        return torch.cat([mean, spread.expand(1, mean.shape[1])])

    def _scales(self, features: Tensor | None) -> list[float]:
        pred, h, z = self._rollout(features, 1)
        self._filtered = (h, z)
        rows = self._summarise(pred).tolist()
        self._uncertainty = rows[-1][0]
        return rows[0][:-1]

    def uncertainty(self) -> float:
        return self._uncertainty

    def _trajectory(self, features: Tensor | None, horizon: int) -> tuple[list[list[float]], list[float]]:
        rows = self._summarise(self._rollout(features, horizon + 1)[0]).tolist()
        self._uncertainty = rows.pop()[0]
        _, _, noise = self._trend.fit()
        return [row[:-1] for row in rows[:horizon]], [row[-1] * noise for row in rows]

    def _extra_state(self) -> dict[str, Any]:
        return {**super()._extra_state(), "h": self._h.clone(), "z": self._z.clone(), "uncertainty": self._uncertainty}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        super()._load_extra_state(state)
        self._h.copy_(state["h"])
        self._z.copy_(state["z"])
        self._uncertainty = float(state["uncertainty"])
