"""What a Lightning run does around the training steps, with the plugin inside: the tuner's trial fits, checkpoints
saved outside ``fit``, files only where the run keeps its logs, the plugin's state inside its callback's entry,
and a module that configures no optimizer."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.tuner import Tuner
from torch.utils.data import DataLoader

from lightning_hybrid import hybrid_callbacks, is_unverified_checkpoint
from lightning_hybrid.callbacks.base import STATE_VERSION
from tests.golden import DATA
from tests.helpers import (
    RULE,
    RegressionModel,
    flat_params,
    hybrid_trainer,
    loader,
    plugin_state,
    regression_data,
    scheduler_of,
)

LIGHTNING_KEYS = {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks"}
LIGHTNING_KEYS |= {"optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters"}


def _trainer(root, hybrid: bool = True, max_steps: int = 30, callbacks=(), **kwargs) -> L.Trainer:
    """``hybrid_trainer`` with the rule on short cycles and no logger; plain Lightning when not ``hybrid``."""
    plain = {} if hybrid else {"strategy": "auto"}
    trainer, _ = hybrid_trainer(
        max_steps, hybrid=hybrid_callbacks(**RULE) if hybrid else [], extra_callbacks=list(callbacks), logger=False,
        default_root_dir=root, **plain, **kwargs,
    )  # fmt: skip
    return trainer


def test_the_lr_finder_suggests_plain_lightnings_rate_and_the_fit_after_it_jumps(tmp_path):
    """During the finder's trial fit the plugin stands aside (the strategy routes through the engine only while it
    is bound to a fit's training), so the suggestion is plain Lightning's; the fit that follows is hybrid."""
    suggested = {}
    for hybrid in (False, True):
        trainer = _trainer(tmp_path / str(hybrid), hybrid)
        model = RegressionModel()
        finder = Tuner(trainer).lr_find(model, loader(), min_lr=1e-4, max_lr=1.0, num_training=20)
        suggested[hybrid] = (finder.suggestion(), finder.results["loss"])
        trainer.fit(model, loader())
        if hybrid:
            summary = scheduler_of(trainer).summary(trainer)
            assert summary["jumps_made"] >= 2 and summary["backward_passes"] == 30
    assert suggested[True] == suggested[False]
    assert not list(tmp_path.rglob(".lr_find*.ckpt"))  # the finder cleaned up its own checkpoint


class SizedData(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 2

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(256, 1), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(64, 2), batch_size=self.batch_size)


def test_the_batch_size_finder_runs_in_a_hybrid_run_as_in_plain_lightning(tmp_path):
    found = {}
    for hybrid in (False, True):
        trainer = _trainer(tmp_path / str(hybrid), hybrid)
        data = SizedData()
        found[hybrid] = Tuner(trainer).scale_batch_size(RegressionModel(), datamodule=data, max_trials=3)
        trainer.fit(RegressionModel(), datamodule=data)
        assert trainer.global_step == 30
    assert found[True] == found[False] > 2


@pytest.mark.parametrize("when", ["before fit", "after validate", "after fit"])
def test_a_checkpoint_saved_outside_fit_loads_and_resumes(tmp_path, when):
    trainer, model = _trainer(tmp_path), RegressionModel()
    if when == "before fit":  # as Lightning's own tests do: the model attached, no stage run yet
        trainer.strategy.connect(model)
    if when == "after validate":
        trainer.validate(model, loader(64))
    if when == "after fit":
        trainer.fit(model, loader())
    path = tmp_path / "outside.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    state = plugin_state(checkpoint)
    assert state["version"] == STATE_VERSION and (state["family"] is None) == (when != "after fit")
    resumed, again = _trainer(tmp_path / "resumed", max_steps=40), RegressionModel(seed=1)
    resumed.fit(again, loader(), ckpt_path=path)
    assert resumed.global_step == 40
    summary = scheduler_of(resumed).summary(resumed)
    assert summary["steps_total"] == 40 and summary["jumps_made"] >= 1  # whole-run counts, resumed or not
    if when != "after fit":  # a fresh engine's state: the resumed run is a fresh run from the saved weights
        fresh, weights = _trainer(tmp_path / "fresh", max_steps=40), RegressionModel(seed=1)
        weights.load_state_dict(checkpoint["state_dict"])
        fresh.fit(weights, loader())
        assert torch.equal(flat_params(again), flat_params(weights))


def test_the_plugins_state_lives_under_its_callbacks_and_nothing_lands_beside_the_checkpoints(tmp_path):
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=10, save_top_k=-1)
    trainer = _trainer(tmp_path, callbacks=[every], enable_checkpointing=True)
    trainer.fit(RegressionModel(), loader())
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files and all(name.endswith(".ckpt") for name in files)
    for name in files:
        checkpoint = torch.load(tmp_path / "ckpt" / name, weights_only=True)
        assert set(checkpoint) <= LIGHTNING_KEYS, set(checkpoint) - LIGHTNING_KEYS  # Lightning's tests compare it
        assert plugin_state(checkpoint)["unverified"] == is_unverified_checkpoint(checkpoint)
    assert not list(tmp_path.rglob("hybrid_summary.json"))


def test_the_unverified_flag_of_an_earlier_layout_is_still_read():
    old = torch.load(DATA / "state_v2_outer_guarded_pending.ckpt", weights_only=False)
    assert old["hybrid_unverified_segment"] and is_unverified_checkpoint(old)
    assert "unverified" not in plugin_state(old)  # version 2 kept it at the top level


class NoOptimizer(RegressionModel):
    def configure_optimizers(self):
        return None


def test_a_module_without_an_optimizer_trains_as_in_plain_lightning_with_a_warning(tmp_path):
    runs = {}
    for hybrid in (False, True):
        trainer, model = _trainer(tmp_path / str(hybrid), hybrid, max_steps=-1, max_epochs=1), NoOptimizer()
        with pytest.warns(UserWarning, match="no optimizer" if hybrid else "optimizer"):
            trainer.fit(model, loader())
        runs[hybrid] = (flat_params(model), model.training_step_calls, trainer.global_step)
    assert torch.equal(runs[True][0], runs[False][0]) and runs[True][1:] == runs[False][1:]
    assert scheduler_of(trainer).summary(trainer)["steps_total"] == 0


def _compiled_run(root, compiled: bool, ckpt_path=None, max_steps: int = 40):
    """The default rule on short cycles, jumping far enough to be rolled back, on a ``torch.compile``d module
    (dynamo's graph capture with the eager backend: the same kernels as uncompiled, so the same bits)."""
    every = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    hybrid = hybrid_callbacks(**RULE, outer_lr=1.5, outer_momentum=0.6, keep_norms=False, restart=False)
    trainer, _ = hybrid_trainer(
        max_steps, hybrid=hybrid, extra_callbacks=[every] if ckpt_path is None else [], logger=False,
        default_root_dir=root, enable_checkpointing=ckpt_path is None,
    )  # fmt: skip
    model = RegressionModel(lr=3e-2)
    trainer.fit(torch.compile(model, backend="eager") if compiled else model, loader(64, 16), ckpt_path=ckpt_path)
    return flat_params(model), scheduler_of(trainer).summary(trainer)


def test_a_compiled_module_trains_jumps_rolls_back_and_resumes_exactly(tmp_path):
    torch._dynamo.reset()
    plain, plain_summary = _compiled_run(tmp_path / "eager", compiled=False)
    weights, summary = _compiled_run(tmp_path / "compiled", compiled=True)
    assert summary["jumps_made"] >= 3 and summary["jumps_undone"] >= 1
    assert torch.equal(weights, plain) and summary["jumps_kept"] == plain_summary["jumps_kept"]
    resumed, again = _compiled_run(tmp_path / "resumed", True, tmp_path / "compiled" / "ckpt" / "step=20.ckpt")
    assert torch.equal(resumed, weights) and again["jumps_undone"] == summary["jumps_undone"]
