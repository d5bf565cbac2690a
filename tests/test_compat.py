"""Lightning features that must keep working under the hybrid strategy."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_hybrid import DivergenceMonitor, HybridPredictStrategy, HybridScheduler, Phase, hybrid_callbacks
from lightning_hybrid.callbacks import HybridComponent
from tests.helpers import FAST, RegressionModel, StepRecorder, flat_params, hybrid_trainer, loader, phases, scheduler_of


def _backward_per_phase(recorder, logger):
    out = {}
    for step, phase in phases(logger).items():
        out.setdefault(phase, set()).add(recorder.backward[step])
    return out


def test_manual_optimization_skips_backward_on_predicted_steps():
    recorder = StepRecorder()
    trainer, logger = hybrid_trainer(max_steps=60, extra_callbacks=[recorder])
    model = RegressionModel(automatic=False)
    trainer.fit(model, loader())
    per_phase = _backward_per_phase(recorder, logger)
    assert per_phase[Phase.PREDICT] == {0}
    assert per_phase[Phase.FULL] == per_phase[Phase.CORRECT] == per_phase[Phase.WARMUP] == {1}
    # manual optimization: the user's training_step owns the step, so every predicted step runs its forward
    assert model.forward_with_grad == model.backward_calls


def test_gradient_accumulation_costs_no_backward_when_predicting():
    recorder = StepRecorder()
    trainer, logger = hybrid_trainer(max_steps=40, accumulate_grad_batches=2, extra_callbacks=[recorder])
    trainer.fit(RegressionModel(), loader(512))
    per_phase = _backward_per_phase(recorder, logger)
    assert per_phase[Phase.PREDICT] == {0}
    assert per_phase[Phase.FULL] == {2}
    predict_steps = [s for s, p in phases(logger).items() if p is Phase.PREDICT]
    assert predict_steps and all(recorder.forward[s] <= 1 for s in predict_steps)


class _OrdinaryUpdateNorms(Callback):
    def __init__(self):
        self.norms = []

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        self.before = flat_params(pl_module)
        self.phase = next(cb for cb in trainer.callbacks if hasattr(cb, "predicting")).phase

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        if self.phase.ordinary:
            self.norms.append(float((flat_params(pl_module) - self.before).norm()))


def test_gradient_clipping_applies_to_ordinary_steps():
    watch = _OrdinaryUpdateNorms()
    trainer, logger = hybrid_trainer(max_steps=40, gradient_clip_val=1e-3, extra_callbacks=[watch])
    trainer.fit(RegressionModel(optimizer="sgd", lr=1.0), loader())
    assert Phase.PREDICT in phases(logger).values()
    assert max(watch.norms) <= 1e-3 * (1 + 1e-4)  # SGD, lr=1: the update is the clipped gradient


def test_several_param_groups_each_get_their_own_scale():
    trainer, logger = hybrid_trainer(max_steps=60)
    model = RegressionModel(param_groups=True, scheduler=True)
    trainer.fit(model, loader())
    assert Phase.PREDICT in phases(logger).values()
    predictor = next(cb for cb in trainer.callbacks if type(cb).__name__ == "DynamicsPredictor").predictor
    assert len(predictor.directions()) == 2
    assert len(predictor.scales()) == 2


def test_bf16_mixed_on_cpu():
    trainer, logger = hybrid_trainer(max_steps=40, precision="bf16-mixed")
    model = RegressionModel()
    trainer.fit(model, loader())
    assert Phase.PREDICT in phases(logger).values()
    assert torch.isfinite(flat_params(model)).all()
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _plain_trainer(**kwargs):
    return L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_validate_and_test_are_unaffected():
    model = RegressionModel()
    plain_val = _plain_trainer().validate(model, loader(64), verbose=False)
    plain_test = _plain_trainer().test(model, loader(64), verbose=False)
    for callbacks in (hybrid_callbacks(), []):  # with or without the callbacks, outside fit nothing changes
        trainer = _plain_trainer(strategy=HybridPredictStrategy(), callbacks=callbacks)
        assert trainer.validate(model, loader(64), verbose=False) == plain_val
        assert trainer.test(model, loader(64), verbose=False) == plain_test


def test_strategy_without_callbacks_fails_at_fit_with_the_fix():
    trainer = _plain_trainer(max_steps=3, strategy=HybridPredictStrategy())
    with pytest.raises(MisconfigurationException, match=r"callbacks=\[HybridScheduler\(\)\].*_target_: lightning"):
        trainer.fit(RegressionModel(), loader())


def test_a_component_not_listed_is_the_schedulers_own_and_rides_in_its_state():
    """A component of a kind the user did not list is the scheduler's own: used, not added to the Trainer's
    callbacks, and checkpointed inside the scheduler's state; the listed ones stay callbacks of their own."""
    callbacks = [cb for cb in hybrid_callbacks(**FAST) if not isinstance(cb, DivergenceMonitor)]
    listed = list(callbacks)
    trainer = _plain_trainer(max_steps=30, strategy=HybridPredictStrategy(), callbacks=callbacks)
    trainer.fit(RegressionModel(), loader())
    assert [cb for cb in trainer.callbacks if isinstance(cb, HybridComponent)] == listed  # nothing placed
    scheduler = scheduler_of(trainer)
    assert scheduler.monitor is next(c for c in scheduler.components if isinstance(c, DivergenceMonitor))
    assert scheduler.monitor.divergence.loss_stats.count > 0  # it watched the run
    states = trainer._checkpoint_connector.dump_checkpoint()["callbacks"]
    assert not any("DivergenceMonitor" in key for key in states)
    assert set(states["HybridScheduler"]["components"]) == {"DivergenceMonitor"}
    assert "DynamicsPredictor" in states  # listed: Lightning holds its state


def test_two_components_of_a_kind_are_refused_before_training():
    with pytest.raises(RuntimeError, match="more than one stateful callback of type `DivergenceMonitor`"):
        _plain_trainer(
            max_steps=3, strategy=HybridPredictStrategy(), callbacks=[*hybrid_callbacks(), DivergenceMonitor()]
        )


def test_string_strategy_names_are_registered():
    trainer = _plain_trainer(max_steps=12, strategy="hybrid", callbacks=hybrid_callbacks(**FAST))
    trainer.fit(RegressionModel(), loader())
    assert isinstance(trainer.strategy, HybridPredictStrategy)
    assert trainer.strategy.root_device == torch.device("cpu")
    assert "hybrid_ddp" in L.pytorch.strategies.StrategyRegistry


def test_model_without_trainable_parameters_is_refused():
    model = RegressionModel()
    model.net.requires_grad_(False)
    trainer, _ = hybrid_trainer(max_steps=3)
    with pytest.raises(ValueError, match="no trainable parameters"):
        trainer.fit(model, loader())


def test_several_optimizers_are_refused_by_the_per_step_mode():
    class TwoOptimizers(RegressionModel):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.net[0].parameters(), 0.1), torch.optim.SGD(self.net[2].parameters(), 0.1)]

    model = TwoOptimizers(automatic=False)
    trainer, _ = hybrid_trainer(max_steps=3)  # the helpers' per-step settings
    with pytest.raises(MisconfigurationException, match="runs the per-step mode, which trains one optimizer"):
        trainer.fit(model, loader())


class _ScaledGradients(Callback):
    """A user's hook that changes the gradients between the backward pass and clipping: in place, or through
    ``.data``, which no version counter sees (common in older code)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        for p in pl_module.parameters():
            (p.grad.data if self.how == "data" else p.grad).mul_(10.0)


class _GradientNorms(TorchDispatchMode):
    """Counts the passes over the gradients that measure their norms."""

    def __init__(self):
        super().__init__()
        self.passes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.passes += func.__name__.startswith("_foreach_norm")
        return func(*args, **(kwargs or {}))


class _NormsStepped(Callback):
    """The gradients' norm each update was made with, read by a step hook of the optimizer's after it stepped."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_start(self, trainer, pl_module):
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(self._read)

    def _read(self, optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


@pytest.mark.parametrize("how", ["none", "in_place", "data"])
def test_clipping_by_norm_clips_right_and_trains_as_plain_lightning_whatever_a_hook_did(how):
    """Prediction off, the plugin beside Lightning's own strategy trains as plain Lightning bitwise, clipping by norm
    included, whatever a user's hook did to the gradients after the guard read them (in place, or through
    ``.data``): Lightning's clipping measures them itself, so every update is made with a gradient norm of at most
    the clip value. A step reads its gradients twice: the guard's reading, and clipping's."""

    def fit(hybrid):
        norms = _NormsStepped()
        extra = [_ScaledGradients(how)] if how != "none" else []
        plugin = [HybridScheduler(enable_prediction=False)] if hybrid else []
        trainer = L.Trainer(max_steps=24, accelerator="cpu", callbacks=[*plugin, *extra, norms], logger=False,
                            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                            gradient_clip_val=0.05)  # fmt: skip
        torch.manual_seed(0)
        model = RegressionModel()
        with _GradientNorms() as counted:
            trainer.fit(model, loader())
        return flat_params(model), counted.passes, norms.norms

    plain, plain_passes, plain_norms = fit(hybrid=False)
    hybrid, passes, norms = fit(hybrid=True)
    assert torch.equal(hybrid, plain) and norms == plain_norms
    assert len(norms) == 24 and max(norms) <= 0.05 * (1 + 1e-5)
    assert plain_passes == 24 and passes == 48
