"""Several optimizers on one loss (Muon for the hidden matrix beside AdamW for the rest, manual optimization): the
default rule treats their parameters as one trajectory (one anchor, one jump, one verdict, one guard a step);
optimizers on different losses make the plugin step aside, and the per-step mode refuses several by name."""

import json

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_hybrid import hybrid_callbacks
from lightning_hybrid.engine import OptimizerSet
from lightning_hybrid.runner import run
from tests.helpers import (
    APP_SMALL_GPT,
    APP_TRAINER,
    MuonModel,
    app_config,
    by_step,
    flat_params,
    hybrid_trainer,
    loader,
    scheduler_of,
)

APP_BASE = [o for o in APP_TRAINER if not o.startswith(("predictor", "hybrid"))]  # the default rule

# the defaults on short cycles, counted in batches (each batch steps both optimizers: two global steps)
SHORT = dict(warmup_steps=10, full_steps=6, verify_window=3, verify_resolution=0.0)
BATCHES = 40


def _fit(model=None, steps=2 * BATCHES, settings=SHORT, ckpt_path=None, **kwargs):
    trainer, logger = hybrid_trainer(steps, hybrid=hybrid_callbacks(**settings), **kwargs)
    model = model or MuonModel()
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return model, trainer, logger


class StoreWatch(L.Callback):
    def on_train_batch_end(self, trainer, *args):
        self.store = scheduler_of(trainer).engine.store


def test_muon_and_adamw_on_one_loss_are_one_trajectory_that_jumps_and_is_judged():
    watch = StoreWatch()
    model, trainer, _ = _fit(extra_callbacks=[watch])
    scheduler = scheduler_of(trainer)
    store, summary = watch.store, scheduler.summary()
    assert isinstance(store.optimizer, OptimizerSet) and len(store.params) == 4  # both optimizers' parameters
    assert trainer.global_step == 2 * BATCHES and summary["steps_total"] == BATCHES  # a step is a batch
    assert summary["backward_passes"] == BATCHES and model.batches == BATCHES
    assert summary["jumps_made"] >= 3 and summary["jumps_kept"] + summary["jumps_undone"] == summary["jumps_made"]
    # every cycle is counted in batches: first jump after the warmup and a cycle, none the fit cannot judge
    assert summary["jumps_made"] + summary["momentum_restarts"] == (BATCHES - 10) // 6 - 1
    plain = MuonModel()
    L.Trainer(max_steps=2 * BATCHES, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(
        plain, loader()
    )
    assert not torch.equal(flat_params(model), flat_params(plain))  # the jumps moved every parameter, not just
    weight_moved = [not torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters())]
    assert all(weight_moved)  # Muon's matrix and AdamW's biases and head alike


def test_with_prediction_off_two_optimizers_train_as_plain_lightning_bitwise():
    model, _, _ = _fit(settings={**SHORT, "enable_prediction": False})
    plain = MuonModel()
    L.Trainer(max_steps=2 * BATCHES, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(
        plain, loader()
    )
    assert torch.equal(flat_params(model), flat_params(plain))
    assert [s.get_last_lr() for s in model.lr_schedulers()] == [s.get_last_lr() for s in plain.lr_schedulers()]


def test_a_non_finite_step_is_skipped_for_every_optimizer():
    class Weights(L.Callback):
        def __init__(self):
            self.after = []

        def on_train_batch_end(self, trainer, pl_module, *args):
            self.after.append([p.detach().clone() for p in pl_module.parameters()])

    weights = Weights()
    model, trainer, _ = _fit(MuonModel(nan_at=(3,)), steps=12, extra_callbacks=[weights])
    assert scheduler_of(trainer).summary()["nonfinite_steps_skipped"] == 1
    assert all(torch.equal(a, b) for a, b in zip(weights.after[2], weights.after[3]))  # neither optimizer stepped
    assert not any(torch.equal(a, b) for a, b in zip(weights.after[3], weights.after[4]))  # both did next
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_resume_from_a_checkpoint_in_every_phase_is_bitwise_exact(tmp_path):
    """Checkpoints at epoch ends (8 batches, 16 global steps): in Warmup (batch 8), at a cycle's end with a jump
    due (16), inside a verification window (24), and after."""
    checkpoints = ModelCheckpoint(tmp_path, every_n_train_steps=16, save_top_k=-1, filename="{step}")
    model, trainer, _ = _fit(extra_callbacks=[checkpoints], enable_checkpointing=True)
    want, summary = flat_params(model), scheduler_of(trainer).summary()
    paths = by_step(tmp_path)
    assert [p.stem for p in paths][:3] == ["step=16", "step=32", "step=48"]
    for path in paths[:3]:
        resumed, again, _ = _fit(ckpt_path=path)
        assert torch.equal(flat_params(resumed), want), path.name
        got = scheduler_of(again).summary()
        assert [got[k] for k in ("jumps_made", "jumps_kept", "jumps_undone")] == [
            summary[k] for k in ("jumps_made", "jumps_kept", "jumps_undone")
        ], path.name


def test_state_on_host_makes_the_same_two_optimizer_run_bitwise():
    model, _, _ = _fit()
    host, _, _ = _fit(settings={**SHORT, "state_on_host": True})
    assert torch.equal(flat_params(model), flat_params(host))


@pytest.mark.parametrize(("losses", "every"), [(2, 1), (1, 2)], ids=["two losses", "one optimizer every other batch"])
def test_optimizers_that_do_not_step_together_on_one_loss_make_the_plugin_step_aside(tmp_path, losses, every):
    """A generator and a discriminator (a loss and a backward pass each), or an optimizer that steps every other
    batch: not one trajectory. The plugin says so in the first batch and the fit is plain Lightning's, bitwise."""
    with pytest.warns(UserWarning, match="the plugin steps aside and the rest of this fit is plain Lightning"):
        model, trainer, _ = _fit(MuonModel(losses=losses, every=every), steps=60, logger=CSVLogger(tmp_path))
    summary, first = scheduler_of(trainer).summary(), 0 if every == 1 else 1  # the batch that showed it
    assert (
        summary["stepped_aside"].startswith(f"at step {first}: 2 optimizers took") and summary["steps_total"] == first
    )
    report = scheduler_of(trainer).report()
    assert f"stepped aside at step {first}" in report
    if first == 0:  # nothing of the plugin's ran: one line, no count of its steps, no mode's claims
        assert report == f"hybrid: stepped aside {summary['stepped_aside']}; the fit was plain Lightning"
    (written,) = tmp_path.rglob("hybrid_summary.json")  # the end of fit says it too
    assert json.loads(written.read_text())["stepped_aside"] == summary["stepped_aside"]
    plain = MuonModel(losses=losses, every=every)
    L.Trainer(max_steps=60, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(plain, loader())
    assert torch.equal(flat_params(model), flat_params(plain))


def test_the_per_step_mode_refuses_several_optimizers_by_name():
    trainer, _ = hybrid_trainer(6, hybrid=hybrid_callbacks(predictor="linear"))
    with pytest.raises(MisconfigurationException, match="predictor='linear' runs the per-step mode, which trains one"):
        trainer.fit(MuonModel(), loader())


def test_the_muon_experiment_trains_under_the_default_rule_in_the_app(tmp_path):
    """``experiment=muon_gpt``: Muon for the hidden matrices, AdamW for the rest; the schedule in batches."""
    cfg = app_config(
        tmp_path, "experiment=muon_gpt", "trainer.max_steps=40", "hybrid.warmup_steps=4", "hybrid.full_steps=4",
        "predictor.verify_window=2", "trainer.val_check_interval=5", "model.warmup_steps=0",
        base=[*APP_BASE, *APP_SMALL_GPT],
    )  # fmt: skip
    assert cfg.model.max_steps == 20  # 40 global steps: 20 batches of two optimizer steps
    run(cfg)
    summary = json.loads((tmp_path / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())
    assert summary["steps_total"] == 20 and summary["jumps_made"] >= 2 and "stepped_aside" not in summary
