"""The few private names of Lightning and torch the plugin still relies on, each checked where a release could take
it away, with a message that says what broke (docs/how-it-works.md, "What the plugin takes from Lightning")."""

from __future__ import annotations

import importlib

import lightning as L
import pytest
import torch

from lightning_hybrid import HybridPredictStrategy, HybridScheduler
from tests.helpers import RegressionModel, hybrid_trainer, loader, scheduler_of


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("lightning.fabric.utilities.init", "_materialize_distributed_module"),
        ("lightning.fabric.utilities.optimizer", "_optimizers_to_device"),
        ("lightning.pytorch.strategies.strategy", "_ForwardRedirection"),
    ],
)
def test_the_fsdp_setup_finds_lightnings_helpers(module, name):
    """``HybridFSDPStrategy.setup`` is ``ModelParallelStrategy.setup`` with the sharding done for the module; it
    calls the two helpers Lightning's own setup calls, and runs each step through the module's own call with
    Lightning's forward redirection."""
    assert hasattr(importlib.import_module(module), name), (
        f"Lightning {L.__version__} has no {module}.{name}: HybridFSDPStrategy.setup (fsdp.py) must follow "
        "ModelParallelStrategy.setup of this release"
    )


@pytest.mark.parametrize("algorithm", ["value", "norm"])
def test_clipping_runs_inside_the_closure_the_optimizer_step_is_given(algorithm):
    """The plugin guards a step from ``on_before_optimizer_step`` and drops a skipped update's gradients after the
    closure Lightning hands the optimizer's ``step`` (a step pre-hook wraps it), where Lightning has clipped: torch's
    value clipping fails on a step with no gradient. Beside Lightning's own strategy, with every step past the
    tenth skipped as an outlier, the fit runs through and nothing is set on the precision plugin."""
    trainer = L.Trainer(max_steps=30, accelerator="cpu", callbacks=[HybridScheduler(grad_outlier_factor=1e-9)],
                        gradient_clip_val=0.5, gradient_clip_algorithm=algorithm, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    own = dict(vars(trainer.precision_plugin))
    trainer.fit(RegressionModel(), loader())
    assert trainer.global_step == 30 and vars(trainer.precision_plugin) == own, (
        f"Lightning {L.__version__} clips outside the closure handed to optimizer.step: see engine/step_hooks.py"
    )
    assert scheduler_of(trainer).summary()["outlier_steps_skipped"] >= 10


def test_the_accelerator_connector_tells_the_single_device_strategy_its_device():
    """``HybridPredictStrategy`` takes the device the Trainer selected from ``parallel_devices``, which Lightning's
    accelerator connector sets on any strategy that has the attribute."""
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=HybridPredictStrategy(), logger=False)
    assert trainer.strategy.parallel_devices == [torch.device("cpu")], (
        f"Lightning {L.__version__} no longer fills `parallel_devices`: HybridPredictStrategy.root_device "
        "(strategy.py) must learn the selected device another way"
    )


def test_torch_still_offers_what_the_device_guard_uses():
    """A quiet step hands a fused optimizer ``found_inf`` (``_step_supports_amp_scaling``) and unscales the norm
    by the scaler's scale without reading it (``_get_scale_async``)."""
    fused = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True)
    assert fused._step_supports_amp_scaling, f"torch {torch.__version__}: see engine/guard.py skips_on_device"
    assert callable(getattr(torch.amp.GradScaler, "_get_scale_async", None)), (
        f"torch {torch.__version__} has no GradScaler._get_scale_async: see engine/guard.py check_on_device"
    )


def test_the_fit_loop_still_counts_the_batches_that_stepped():
    """The scalars go to the loggers only on the batches Lightning logs, at its step: its rule counts the batches
    that stepped (``_batches_that_stepped``), which ``callbacks/scalars.py`` reads at ``on_train_batch_end``."""
    trainer, _ = hybrid_trainer(6, logger=False)
    trainer.fit(RegressionModel(), loader())
    loop = trainer.fit_loop.epoch_loop
    assert isinstance(getattr(loop, "_batches_that_stepped", None), int) and loop._batches_that_stepped == 6, (
        f"Lightning {L.__version__} no longer counts `_batches_that_stepped`: see callbacks/scalars.py logging_step"
    )


def test_the_callback_metrics_are_one_dict_that_keeps_what_is_put_in_it():
    """``callbacks/scalars.py`` puts the scalars into the dict ``trainer.callback_metrics`` returns, where Lightning
    keeps its own callback metrics between the times it reads them."""
    trainer, _ = hybrid_trainer(6, logger=False)
    trainer.fit(RegressionModel(), loader())
    trainer.callback_metrics["hybrid/probe"] = torch.tensor(1.0)
    kept = trainer.callback_metrics is trainer.callback_metrics and "hybrid/probe" in trainer.callback_metrics
    assert kept, f"Lightning {L.__version__}'s callback_metrics no longer keep what is put in: see callbacks/scalars.py"


def test_fabrics_optimizer_wrapper_holds_the_strategy_whose_precision_has_the_scaler():
    """``HybridLoop`` refuses a gradient scaler, which skips whole steps its hooks would not see end; it finds it
    through the strategy Fabric's optimizer wrapper keeps."""
    from lightning.fabric.plugins import MixedPrecision

    scaled = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[scaled])
    model = torch.nn.Linear(2, 2)
    _, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters()))
    precision = getattr(getattr(optimizer, "_strategy", None), "precision", None)
    assert precision is fabric.strategy.precision and precision.scaler is not None, (
        f"Lightning {L.__version__}'s Fabric optimizer no longer keeps its strategy as `_strategy`: "
        "loop.py's _refuse_gradient_scaler must find the scaler another way"
    )
