"""The plugin from Lightning's hooks alone, beside Lightning's own strategy: nothing of Lightning's objects changes
during a fit or after it, whatever fails; the strategy and every callback pickle and deep-copy mid-fit; and the same
callback trains, bitwise alike, in a Trainer of either Lightning package, which each import the plugin alone. (Two
ranks and launchers: ``tests/test_any_strategy.py``; clipping: ``tests/test_compat.py``; the bar:
``tests/test_progress.py``.)"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import lightning as L
import pytest
import pytorch_lightning
import torch

from lightning_hybrid import HybridScheduler
from tests.helpers import (
    BESIDE,
    ROOT,
    RegressionModel,
    StandaloneRegression,
    flat_params,
    loader,
    scheduler_of,
    script_env,
    trained,
    users_trainer,
)


def _trainer(callbacks: list, package=L, steps: int = 40) -> L.Trainer:
    """A Trainer as a user writes one, on one CPU device with Lightning's own strategy and progress bar."""
    return users_trainer(callbacks, steps, package, enable_progress_bar=True)


class Inert(L.Callback):
    """A stateful callback that does nothing: the plain run's stand-in for the plugin."""

    def state_dict(self) -> dict:
        return {"inert": 1}


def _shape(trainer: L.Trainer) -> dict:
    """What the plugin must leave of each of the fit's objects as Lightning made it: its class and the names of its
    attributes (an attribute set on an instance, or a class changed, shows here)."""
    objects = {
        "strategy": trainer.strategy,
        "precision": trainer.precision_plugin,
        "bar": trainer.progress_bar_callback,
        "trainer": trainer,
        "accelerator": trainer.accelerator,
    }
    return {name: (type(o), sorted(vars(o))) for name, o in objects.items()}


class Watch(L.Callback):
    """Mid-fit, at step ``at``: the objects' shape and the callbacks list; and the strategy and every callback
    pickled and deep-copied."""

    def __init__(self, at: int = 25) -> None:
        self.at = at
        self.seen: tuple | None = None

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.at:
            for thing in (trainer.strategy, *trainer.callbacks):
                pickle.loads(pickle.dumps(thing))
                copy.deepcopy(thing)
            self.seen = (_shape(trainer), list(trainer.callbacks))


@pytest.mark.parametrize("rule", sorted(BESIDE))
def test_nothing_of_lightnings_objects_changes_during_a_fit_or_after(rule):
    """Beside a plain run with a do-nothing callback in its place, mid-fit and after: the strategy, the precision
    plugin, the progress bar, the accelerator and the Trainer keep their classes and attributes, the callbacks list
    is the one the Trainer was built with, and no step hook stays on the optimizer."""
    runs = {}
    for name, first in (("plain", Inert()), ("plugin", HybridScheduler(**BESIDE[rule]))):
        watch = Watch()
        trainer = _trainer([first, watch])
        built = list(trainer.callbacks)
        trainer.fit(RegressionModel(scheduler=True), loader())
        (mid_fit, callbacks) = watch.seen
        assert callbacks == built == trainer.callbacks, name
        optimizer = trainer.optimizers[0]
        assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks, name
        runs[name] = (mid_fit, _shape(trainer), trainer)
    assert runs["plugin"][:2] == runs["plain"][:2]
    summary = scheduler_of(runs["plugin"][2]).summary()
    assert summary["jumps_made"] >= 1 if rule == "default" else summary["averaged_steps"] > 0


class FailsAt(RegressionModel):
    """A user's step that fails at step 12, after the plugin's warm-up."""

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 12:
            raise RuntimeError("the user's step failed")
        return super().training_step(batch, batch_idx)


class FailsOnException(L.Callback):
    """Another callback, listed before the plugin, whose own ``on_exception`` fails: Lightning stops there, and
    never reaches the plugin's."""

    def on_exception(self, trainer, pl_module, exception):
        raise RuntimeError("another callback failed too")


@pytest.mark.parametrize("other", [False, True], ids=["the-plugins-on_exception", "another-callback-fails-first"])
def test_a_fit_that_fails_anywhere_leaves_lightnings_objects_as_a_plain_one_does(other):
    """Even where Lightning never reaches the plugin's ``on_exception``, the fit's objects are as a plain failed
    fit leaves them; step hooks left on that fit's optimizer do nothing, and the next fit takes them off."""
    shapes, failing = {}, [FailsOnException()] if other else []
    for name, first in (("plain", Inert()), ("plugin", HybridScheduler(**BESIDE["default"]))):
        trainer = _trainer([*failing, first])
        with pytest.raises(RuntimeError, match="another callback failed too" if other else "the user's step failed"):
            trainer.fit(FailsAt(), loader())
        shapes[name] = _shape(trainer)
    assert shapes["plugin"] == shapes["plain"]
    scheduler, optimizer = first, trainer.optimizers[0]
    hooked = bool(optimizer._optimizer_step_pre_hooks)
    assert hooked == other  # only where the plugin's on_exception never ran
    scheduler.engine.step.skipped = True  # a verdict a live hook would act on
    params = [p.detach().clone() for p in trainer.lightning_module.parameters()]
    optimizer.step()  # the failed fit's gradients are still there
    assert all(not torch.equal(a, b) for a, b in zip(params, trainer.lightning_module.parameters()))
    again = _trainer([scheduler], steps=20)
    again.fit(RegressionModel(), loader())
    assert not optimizer._optimizer_step_pre_hooks and again.global_step == 20


@pytest.mark.parametrize("rule", sorted(BESIDE))
def test_the_same_callback_trains_bitwise_alike_in_a_trainer_of_either_lightning_package(rule):
    """``lightning.Trainer`` and the standalone ``pytorch_lightning.Trainer``, each with ``HybridScheduler()`` and
    the same module written on its package: the same weights, bitwise, and the same record."""
    runs = []
    for package, module in ((L, RegressionModel), (pytorch_lightning, StandaloneRegression)):
        trainer = _trainer([HybridScheduler(**BESIDE[rule])], package)
        model = module(scheduler=True)
        trainer.fit(model, loader())
        summary = trained(scheduler_of(trainer).summary())
        runs.append((flat_params(model), summary))
    assert isinstance(trainer, pytorch_lightning.Trainer) and not isinstance(trainer, L.Trainer)
    (ours, summary), (theirs, standalone) = runs
    assert torch.equal(ours, theirs) and summary == standalone
    assert summary["jumps_made"] >= 1 if rule == "default" else summary["averaged_steps"] > 0


def test_the_per_step_mode_in_a_standalone_trainer_names_the_package_its_strategies_are_for():
    trainer = _trainer([HybridScheduler(predictor="linear")], pytorch_lightning)
    with pytest.raises(pytorch_lightning.utilities.exceptions.MisconfigurationException, match=r"lightning\.pytorch"):
        trainer.fit(StandaloneRegression(), loader())


# A user's script on one package, the other missing: a module of its own, the plugin jumping beside the Trainer's
# strategy, and the process's logging of Lightning's messages as importing Lightning alone left it.
ALONE = """
import sys
for missing in {missing}:
    sys.modules[missing] = None  # as if not installed
import {package} as pl
import torch
from lightning_utilities.core import rank_zero
logger = rank_zero.log.name
from lightning_hybrid import HybridScheduler
assert rank_zero.log.name == logger, (logger, rank_zero.log.name)

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)

data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
plugin = HybridScheduler(warmup_steps=2, full_steps=4, verify_window=0)
trainer = pl.Trainer(max_steps=20, accelerator="cpu", callbacks=[plugin], logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
print("jumps", plugin.summary()["jumps_made"])
"""


@pytest.mark.parametrize(
    ("package", "missing"),
    [("pytorch_lightning", ("lightning",)), ("lightning.pytorch", ("pytorch_lightning", "lightning_fabric"))],
    ids=["pytorch_lightning-alone", "lightning-alone"],
)
def test_the_plugin_imports_and_jumps_with_either_lightning_package_alone(package, missing):
    script = ALONE.format(missing=repr(missing), package=package)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=script_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split("jumps")[-1]) >= 1
