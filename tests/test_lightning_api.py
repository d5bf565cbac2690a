"""The few private names of Lightning and torch the plugin still relies on, each checked where a release could take
it away, with a message that says what broke (docs/how-it-works.md, "What the plugin takes from Lightning")."""

from __future__ import annotations

import importlib
import inspect
import pickle
from functools import partial

import lightning as L
import pytest
import torch

from lightning_hybrid import HybridPredictStrategy
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


def test_the_precision_plugin_still_clips_through_clip_gradients():
    """The strategy wraps the precision plugin's public ``clip_gradients`` on its instance, so that clipping a step
    whose gradients were dropped (skipped) or never made (predicted) does nothing instead of failing."""
    params = list(inspect.signature(L.pytorch.plugins.Precision.clip_gradients).parameters)
    assert params[:4] == ["self", "optimizer", "clip_val", "gradient_clip_algorithm"], (
        f"Lightning {L.__version__} changed Precision.clip_gradients{params}: see strategy.py "
        "_clip_only_present_gradients"
    )
    trainer, _ = hybrid_trainer(30, {"grad_outlier_factor": 1e-9}, gradient_clip_val=0.5, logger=False)
    trainer.fit(RegressionModel(), loader())  # every step past the first ten is an outlier, skipped: no grads
    assert isinstance(trainer.precision_plugin.__dict__["clip_gradients"], partial) and trainer.global_step == 30
    pickle.dumps(trainer.strategy)  # the wrapper is a partial of a module function: the strategy still pickles
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
