"""What keeps the plugin's host work per step small (issue 50) still does: Lightning skips the hybrid components'
per-batch hooks they do not define, and a step read to the host measures what the device guard measures."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch
from lightning.pytorch.profilers import Profiler
from torch import nn

from lightning_hybrid import DivergenceMonitor, hybrid_callbacks
from lightning_hybrid.callbacks.base import PER_BATCH_HOOKS
from lightning_hybrid.engine import TorchCollectives
from lightning_hybrid.engine.guard import StepGuard, loss_and_norm
from tests.helpers import RegressionModel, hybrid_trainer, loader


class ActionCounter(Profiler):
    """Counts the actions Lightning profiles; every callback hook it calls is one, named after the callback."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: Counter[str] = Counter()

    def start(self, action_name: str) -> None:
        self.actions[action_name] += 1

    def stop(self, action_name: str) -> None:
        pass


class CountingMonitor(DivergenceMonitor):
    """A user's subclass that defines one per-batch hook: Lightning must still call it."""

    seen = 0

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.seen += 1


def _calls(profiler: ActionCounter, callback: str) -> dict[str, int]:
    prefix = f"[Callback]{callback}"
    return {name.split(".")[-1]: n for name, n in profiler.actions.items() if name.startswith(prefix)}


def test_lightning_calls_only_the_per_batch_hooks_a_component_defines():
    """Lightning's ``_call_callback_hooks`` skips a hook that is not callable; were that to change, every fit with
    the hybrid callbacks would fail, and this test says why."""
    profiler = ActionCounter()
    monitor = CountingMonitor()
    callbacks = [c if not isinstance(c, DivergenceMonitor) else monitor for c in hybrid_callbacks()]
    trainer, _ = hybrid_trainer(12, hybrid=callbacks, profiler=profiler, logger=False)
    try:
        trainer.fit(RegressionModel(), loader())
    except TypeError as err:  # pragma: no cover - only where Lightning changed
        pytest.fail(f"Lightning no longer skips a callback hook set to None ({err}); see callbacks/base.py")
    scheduler = _calls(profiler, "HybridScheduler")
    used = {"on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end"}
    assert all(scheduler[hook] == 12 for hook in used)
    assert not set(scheduler) & (set(PER_BATCH_HOOKS) - used)
    for name in ("DynamicsPredictor", "ResidualCorrector"):
        assert not set(_calls(profiler, name)) & set(PER_BATCH_HOOKS), name
    assert set(_calls(profiler, "CountingMonitor")) & set(PER_BATCH_HOOKS) == {"on_after_backward"}
    assert monitor.seen == 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_read_step_measures_the_gradient_norm_the_device_guard_measures(dtype):
    """A read step and a quiet step measure the same loss and norm, bit for bit (the quiet path's runs are
    bitwise those that read every step), and the norm is the gradients' whole norm."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(dtype)
    loss = model(torch.randn(4, 8, dtype=dtype)).square().mean()
    loss.backward()
    owners = list(model.parameters())
    optimizer = torch.optim.SGD(owners, lr=0.1)
    guard = StepGuard(TorchCollectives())
    read = guard.read(owners, loss.detach().float())
    values, skipped = guard.check_on_device(optimizer, owners, loss.detach().float(), math.inf)
    assert (read.loss, read.grad_norm) == loss_and_norm(values.tolist()) and skipped.item() == 0.0
    expected = torch.linalg.vector_norm(torch.cat([p.grad.double().flatten() for p in owners])).item()
    assert read.grad_norm == pytest.approx(expected, rel=1e-6 if dtype == torch.float32 else 1e-2)
