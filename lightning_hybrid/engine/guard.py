"""The ordinary-step guard: reads a step's loss and gradient norm once, agreed over ranks, and turns the coming
optimizer update into a no-op when it must not reach the weights (non-finite values, an exploding gradient, a
segment that failed verification)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_hybrid.engine.interface import Collectives
from lightning_hybrid.stats import sq_norm


@dataclass
class Reading:
    """One ordinary step's loss and gradient norm, as every rank sees them."""

    loss: float
    grad_norm: float  # unscaled when a gradient scaler is active
    finite: bool
    grads: list[Tensor]  # this rank's local gradients, for a skip


class StepGuard:
    """Measures an ordinary step before its update and can cancel the update.

    Args:
        collectives: the strategy's shard and reduction operations.
        scaler: the precision plugin's gradient scaler, if any: its skips are used instead of dropping gradients.
    """

    def __init__(self, collectives: Collectives, scaler: Any = None) -> None:
        self.collectives = collectives
        self.scaler = scaler

    def read(self, owners: list[Tensor], loss_sum: Tensor | None) -> Reading | None:
        """The step's reading; ``None`` when the user's ``training_step`` skipped the batch (no loss, no grads)."""
        local = self.collectives.local_tensor
        grads = [local(p.grad) for p in owners if p.grad is not None]
        if loss_sum is None and not grads:
            return None
        device = self.collectives.root_device
        loss = loss_sum if loss_sum is not None else torch.full((), math.nan, device=device)
        grad_sq = sq_norm(grads) if grads else torch.zeros((), device=device)
        grad_norm = self.collectives.sum_across_ranks(grad_sq).sqrt()
        loss_v, grad_norm_v = self.mean_over_ranks([loss, grad_norm])  # a mean is non-finite if any rank's is
        finite = math.isfinite(loss_v) and math.isfinite(grad_norm_v)
        if self.scaler is not None:
            grad_norm_v /= float(self.scaler.get_scale())
        return Reading(loss_v, grad_norm_v, finite, grads)

    def mean_over_ranks(self, values: list[Tensor]) -> list[float]:
        """Average scalars over ranks (identity on one device), so every rank takes the same decision."""
        device = self.collectives.root_device
        stacked = torch.stack([v.to(device=device, dtype=torch.float32) for v in values])
        return self.collectives.reduce(stacked, reduce_op="mean").tolist()

    def skip(self, optimizer: Optimizer, grads: list[Tensor]) -> None:
        """Make the coming ``optimizer.step`` a no-op."""
        if self.scaler is not None:
            torch._foreach_mul_(grads, math.nan)  # the scaler skips steps with non-finite gradients
        else:
            optimizer.zero_grad(set_to_none=True)  # optimizers skip parameters without gradients
