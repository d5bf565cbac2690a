"""The ordinary-step guard: reads a step's loss and gradient norm once, agreed over ranks, after its backward pass
and before its update, and decides whether the update must not reach the weights (non-finite values, an exploding
gradient, a segment that failed verification). A skipped update is dropped with its gradients
(:meth:`StepGuard.skip`), where nothing edits them after: Lightning's clipping runs first.

A quiet step (nothing to learn from it, nothing to verify) is guarded without reading anything to the host: its
verdict is a device tensor that skips the update on the device, the way Lightning's gradient scaler does, and its
values are read later with others (:meth:`StepGuard.check_on_device`). That needs an optimizer that takes a
``found_inf`` tensor (torch's fused Adam, AdamW and SGD); with others every step is read."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_hybrid.engine.components import Monitor
from lightning_hybrid.engine.interface import Collectives
from lightning_hybrid.engine.optimizers import members
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.summary import RunCounters

FLOAT32_MAX = torch.finfo(torch.float32).max

# why the guard skipped a step's update: its gradient norm exploded (False), or a value was not finite (True)
SKIPPED = {False: "its gradient norm exploded", True: "its loss or gradient was not finite"}


def skip_message(step: int, why: str) -> str:
    return (
        f"hybrid: skipped the update of step {step}: {why}; the weights and the optimizer's state are as before it. "
        "Further skips in this fit are counted in its summary."
    )


@dataclass
class Reading:
    """One ordinary step's loss and gradient norm, as every rank sees them."""

    loss: float
    grad_norm: float  # unscaled when a gradient scaler is active
    finite: bool


def loss_and_norm(values: list[float]) -> tuple[float, float]:
    """The loss and the gradients' whole norm from a measurement read to the host (:meth:`StepGuard._measure`)."""
    return values[0], math.hypot(*values[1:])


class StepGuard:
    """Measures an ordinary step before its update and can cancel the update.

    Args:
        collectives: the shard and reduction operations of the run's strategy.
        scaler: the precision plugin's gradient scaler, if any: the loss it scaled is unscaled, and so are the
            gradients where they are still scaled as the guard reads them (``grads_scaled``).
        world_size: the number of ranks.
        grads_scaled: the gradients the guard reads are still scaled: the optimizer unscales them in its own step
            (a fused one, to which Lightning leaves them), and a quiet step's skip goes through the scaler.
    """

    def __init__(
        self, collectives: Collectives, scaler: Any = None, world_size: int = 1, grads_scaled: bool = False
    ) -> None:
        self.collectives = collectives
        self.scaler = scaler
        self.grads_scaled = scaler is not None and grads_scaled
        self.device = collectives.root_device  # asked once: a strategy's property builds it on every call
        self.sharded = collectives.sharded
        # several ranks reduce one whole norm, not one per gradient: a length that no rank's gradients can change
        self.whole_norm = collectives.sharded or world_size > 1
        self._limit, self._bound_now, self._mask_now = math.nan, torch.empty(0), torch.empty(0)
        # a Python number in `torch.where` is a new tensor (an operation) at every call: these are made once
        self._zero, self._one, self._nan = (torch.tensor(v, device=self.device) for v in (0.0, 1.0, math.nan))

    def check(
        self,
        step: StepRecord,
        optimizer: Optimizer,
        owners: list[Tensor],
        monitor: Monitor,
        judge: Callable[[float], bool],
        counters: RunCounters,
    ) -> str | None:
        """Guard an ordinary step after its backward pass, before its update. A quiet step is guarded on the device
        (:meth:`check_on_device`); any other is read, ``judge`` gives the verdict on what is still unverified (the
        family's; ``True``: the step's gradient was taken at rejected weights), and a step judged so, or with a
        non-finite loss or gradient, or an exploding gradient norm (these two counted), is marked skipped
        (``step.skipped``: :meth:`skip` drops its update). Returns why a counted skip was made (``SKIPPED``'s words),
        or ``None``."""
        if step.quiet:
            step.reading = self.check_on_device(optimizer, owners, step.loss_sum, monitor.outlier_limit())
            return None
        reading = self.read(owners, step.loss_sum)
        if reading is None:
            step.skipped = True  # the user's training_step skipped this batch
            return None
        step.loss, step.grad_norm = reading.loss, reading.grad_norm
        why = None
        if judge(reading.loss if reading.finite else math.nan):
            step.skipped = True
        elif not reading.finite:
            step.skipped, why = True, SKIPPED[True]
            counters.nonfinite_steps_skipped += 1
        elif monitor.gradient_outlier(reading.grad_norm):
            step.skipped, why = True, SKIPPED[False]
            counters.outlier_steps_skipped += 1
        return why

    def _grads(self, owners: list[Tensor]) -> list[Tensor]:
        if self.sharded:
            local = self.collectives.local_tensor
            return [local(p.grad) for p in owners if p.grad is not None]
        return [p.grad for p in owners if p.grad is not None]

    def _measure(self, grads: list[Tensor], loss_sum: Tensor | None) -> Tensor:
        """``[loss, the gradients' norms...]`` on the device in float32, agreed over ranks (a mean over ranks is
        non-finite if any rank's is, and every rank takes the same decision): one fused norm and one stack, as few
        kernels as every step can afford. The whole norm is taken on the host (:func:`loss_and_norm`) or, for a
        quiet step's decision, on the device. With several ranks it holds one whole norm: a rank holding shards has
        parts of each gradient, whose squared norms add up over ranks. Unscaled by a gradient scaler's scale, on the
        device."""
        loss = loss_sum if loss_sum is not None else torch.full((), math.nan, device=self.device)
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32) if grads else []
        if self.grads_scaled and grads:  # get_scale() would read the scale to the host
            norms = torch._foreach_div(norms, self.scaler._get_scale_async().view(()))
        if self.whole_norm:  # every rank takes part in the sum, with gradients or without
            squares = torch.stack(norms).square().sum() if grads else torch.zeros((), device=self.device)
            norms = [self.collectives.sum_across_ranks(squares).sqrt()]
        return self.collectives.reduce(torch.stack([loss, *norms]), reduce_op="mean")

    def read(self, owners: list[Tensor], loss_sum: Tensor | None) -> Reading | None:
        """The step's reading; ``None`` when the user's ``training_step`` skipped the batch (no loss, no grads).
        Measured as a quiet step is, so that reading every step learns bitwise what quiet steps learn."""
        grads = self._grads(owners)
        if loss_sum is None and not grads:
            return None
        loss, grad_norm = loss_and_norm(self._measure(grads, loss_sum).tolist())
        return Reading(loss, grad_norm, math.isfinite(loss) and math.isfinite(grad_norm))

    def unscaled(self, loss: Tensor) -> Tensor:
        """A loss as the module returned it, from the one its backward pass took (a gradient scaler's, scaled by a
        power of two: exactly undone)."""
        return loss if self.scaler is None else loss / self.scaler._get_scale_async().view(())

    def skips_on_device(self, optimizer: Optimizer) -> bool:
        """Whether this optimizer's update can be cancelled by a device tensor, with no host read: it takes a
        ``found_inf`` (or, under a gradient scaler, leaves the scaler to find one in the gradients it unscales)."""
        return bool(getattr(optimizer, "_step_supports_amp_scaling", False))

    def check_on_device(
        self, optimizer: Optimizer, owners: list[Tensor], loss_sum: Tensor | None, outlier_limit: float
    ) -> tuple[Tensor, Tensor] | None:
        """Guard a quiet step on the device: the update is skipped when the loss or gradient norm is non-finite or
        the norm exceeds ``outlier_limit``. Returns the measurement (:meth:`_measure`) and whether the update was
        skipped (1.0) or not (0.0), device tensors agreed over ranks, for a later read (:func:`host_reading`);
        ``None`` when the user's ``training_step`` skipped the batch. Six kernels in all: each is a launch on every
        quiet step."""
        grads = self._grads(owners)
        if loss_sum is None and not grads:
            return None
        values = self._measure(grads, loss_sum)
        norm = torch.linalg.vector_norm(values * self._mask(values))  # the whole norm, nan if the loss is not finite
        ok = norm <= self._bound(outlier_limit)  # finite, and within the limit
        skipped = torch.where(ok, self._zero, self._one)
        if self.grads_scaled:
            torch._foreach_mul_(grads, torch.where(ok, self._one, self._nan))  # the scaler skips non-finite gradients
        else:
            for member in members(optimizer):  # read by each fused step, as under AMP
                member.found_inf, member.grad_scale = skipped, None
        return values, skipped

    def _mask(self, values: Tensor) -> Tensor:
        """``[0, 1, ..., 1]``: multiplied in, it drops the loss from the norm unless the loss is not finite (then
        nan). Built once per measurement's length."""
        if self._mask_now.shape != values.shape:
            self._mask_now = torch.ones_like(values)
            self._mask_now[0] = 0.0
        return self._mask_now

    def _bound(self, outlier_limit: float) -> Tensor:
        """The whole norm must be at most this to pass: a non-finite one is above any float32, and one above the
        limit is an outlier (compared in float32, as a tensor compares with a number). Built on the device once per
        outlier limit: the limit changes only when steps are read."""
        if self._limit != outlier_limit:
            bound = min(outlier_limit, FLOAT32_MAX)
            self._limit, self._bound_now = outlier_limit, torch.tensor(bound, device=self.device)
        return self._bound_now

    def step_done(self, optimizer: Optimizer) -> None:
        """Take back the ``found_inf`` a quiet step handed ``optimizer``, which has just stepped. A gradient scaler
        hands its own and takes them back after the step, which is still running: they are left to it."""
        if not self.grads_scaled:
            optimizer.__dict__.pop("found_inf", None)
            optimizer.__dict__.pop("grad_scale", None)

    def mean_over_ranks(self, values: list[Tensor]) -> list[float]:
        """Average scalars over ranks (identity on one device), so every rank takes the same decision."""
        stacked = torch.stack([v.to(device=self.device, dtype=torch.float32) for v in values])
        return self.collectives.reduce(stacked, reduce_op="mean").tolist()

    @staticmethod
    def skip(optimizer: Optimizer) -> None:
        """Make the coming ``optimizer.step`` a no-op: optimizers pass over parameters without gradients (under a
        gradient scaler too, which steps an optimizer whose gradients it found finite)."""
        optimizer.zero_grad(set_to_none=True)
