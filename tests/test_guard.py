"""The ordinary-step guard on its own, without a Trainer: what it reads, what it skips and how, on the host and on
the device."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightning_hybrid.algorithms import DivergenceCheck
from lightning_hybrid.engine import StepGuard, StepRecord, TorchCollectives
from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import RunCounters


def _model_with_grads(scale: float = 1.0, fused: bool = False):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=fused or None)
    loss = model(torch.randn(8, 4)).square().mean() * scale
    loss.backward()
    return model, optimizer, loss.detach()


def _grad_norm(model) -> float:
    return math.sqrt(sum(float(p.grad.square().sum()) for p in model.parameters()))


def test_a_reading_is_the_loss_and_the_gradient_norm():
    model, _, loss = _model_with_grads()
    reading = StepGuard(TorchCollectives()).read(list(model.parameters()), loss)
    assert reading.finite and reading.loss == pytest.approx(float(loss))
    assert reading.grad_norm == pytest.approx(_grad_norm(model), rel=1e-6)


def test_a_batch_the_user_skipped_gives_no_reading():
    model = nn.Linear(4, 2)
    assert StepGuard(TorchCollectives()).read(list(model.parameters()), None) is None


class _Scaler:
    def _get_scale_async(self) -> torch.Tensor:  # torch's GradScaler: its scale on the device, unread
        return torch.full((1,), 4.0)


@pytest.mark.parametrize("scaled", [True, False], ids=["a-fused-step-unscales", "lightning-unscaled"])
def test_under_a_gradient_scaler_the_loss_is_unscaled_and_so_are_gradients_still_scaled(scaled):
    """The loss reaches the guard as the scaler scaled it for the backward pass; the gradients are still scaled
    only where the optimizer unscales them in its own step (a fused one), else Lightning unscaled them already."""
    model, _, loss = _model_with_grads()
    guard = StepGuard(TorchCollectives(), _Scaler(), grads_scaled=scaled)
    assert torch.equal(guard.unscaled(loss * 4.0), loss)  # a power of two: exactly undone
    reading = guard.read(list(model.parameters()), loss)
    assert reading.grad_norm == pytest.approx(_grad_norm(model) / (4.0 if scaled else 1.0), rel=1e-6)


def _check(loss_scale: float, judge=lambda loss: False, primed: bool = False):
    """A step guarded, and its update dropped where the guard skipped it (as the engine does after clipping)."""
    model, optimizer, loss = _model_with_grads(loss_scale)
    monitor = DivergenceCheck(grad_outlier_factor=10.0)
    for _ in range(10 if primed else 0):
        monitor.observe(1.0, 1e-6)  # a tiny typical gradient norm: any real one is an outlier
    step, counters, guard = StepRecord(phase=Phase.FULL, loss_sum=loss), RunCounters(), StepGuard(TorchCollectives())
    guard.check(step, optimizer, list(model.parameters()), monitor, judge, counters)
    assert all(p.grad is not None for p in model.parameters())  # read, not yet dropped: clipping runs in between
    if step.skipped:
        guard.skip(optimizer)
    return model, step, counters


def test_an_ordinary_step_passes_with_its_gradients():
    model, step, counters = _check(1.0)
    assert not step.skipped and all(p.grad is not None for p in model.parameters())
    assert counters.nonfinite_steps_skipped == counters.outlier_steps_skipped == 0


@pytest.mark.parametrize(
    ("case", "counted"),
    [("nonfinite", "nonfinite_steps_skipped"), ("outlier", "outlier_steps_skipped"), ("judged", None)],
)
def test_a_step_that_must_not_update_loses_its_gradients_and_is_counted_by_reason(case, counted):
    model, step, counters = _check(
        math.nan if case == "nonfinite" else 1.0, judge=lambda loss: case == "judged", primed=case == "outlier"
    )
    assert step.skipped and all(p.grad is None for p in model.parameters())  # the optimizer skips them
    skipped = {"nonfinite_steps_skipped": counters.nonfinite_steps_skipped}
    skipped["outlier_steps_skipped"] = counters.outlier_steps_skipped
    assert {k for k, v in skipped.items() if v} == ({counted} if counted else set())


def test_the_judge_sees_a_non_finite_loss_as_nan():
    seen = []
    _check(math.inf, judge=lambda loss: seen.append(loss) or False)
    assert len(seen) == 1 and math.isnan(seen[0])


@pytest.mark.parametrize("bad", [False, True])
def test_a_quiet_step_is_guarded_on_the_device_by_a_fused_optimizer(bad):
    model, optimizer, loss = _model_with_grads(math.nan if bad else 1.0, fused=True)
    guard = StepGuard(TorchCollectives())
    assert guard.skips_on_device(optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    step = StepRecord(phase=Phase.FULL, loss_sum=loss, quiet=True)
    guard.check(step, optimizer, list(model.parameters()), DivergenceCheck(), lambda loss: False, RunCounters())
    values, skipped = step.reading  # on the device: nothing read yet
    assert isinstance(values, torch.Tensor) and skipped.item() == float(bad)
    optimizer.step()
    guard.step_done(optimizer)
    moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert moved is not bad and "found_inf" not in vars(optimizer)


def test_an_unfused_optimizer_cannot_be_guarded_on_the_device():
    _, optimizer, _ = _model_with_grads()
    assert not StepGuard(TorchCollectives()).skips_on_device(optimizer)


def test_with_several_ranks_the_measurement_holds_one_whole_norm_whatever_gradients_a_rank_has():
    """Ranks reduce a vector of one length: the loss and the whole norm, also on a rank without gradients (which
    still takes part in the sum over ranks)."""
    model, _, loss = _model_with_grads()
    guard = StepGuard(TorchCollectives(), world_size=2)
    values = guard._measure([p.grad for p in model.parameters()], loss)
    assert values.shape == (2,) and values[1].item() == pytest.approx(_grad_norm(model), rel=1e-6)
    assert guard._measure([], loss).tolist() == [loss.item(), 0.0]
    single = StepGuard(TorchCollectives())._measure([p.grad for p in model.parameters()], loss)
    assert single.shape == (3,)  # one norm per gradient: the whole norm is taken where it is needed
