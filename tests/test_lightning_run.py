"""An ordinary Lightning run stays correct under the plugin, or is refused by name: clipping on skipped and
predicted steps, sparse gradients, a fit that ends inside a segment. Public API only: the Trainer, the settings
and the summary."""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_hybrid import (
    DivergenceMonitor,
    DynamicsPredictor,
    HybridScheduler,
    ResidualCorrector,
    is_predicted_step,
    is_unverified_checkpoint,
)
from tests.helpers import (
    FAST_PHASES,
    RegressionModel,
    SometimesExploding,
    flat_params,
    hybrid_trainer,
    loader,
    plugin_state,
    scheduler_of,
)


def _rolling_back(**settings):
    """Callbacks whose plans blow up in alternate blocks, verified only at the first Correct step, so a failed
    verification skips that ordinary step's update."""
    scheduler = HybridScheduler(**{**FAST_PHASES, "predict_forward_every": 0, **settings})
    return [scheduler, DynamicsPredictor(SometimesExploding()), ResidualCorrector(), DivergenceMonitor()]


@pytest.mark.parametrize("algorithm", ["value", "norm"])
def test_clipping_survives_skipped_steps(tmp_path, algorithm):
    trainer, _ = hybrid_trainer(
        60,
        hybrid=_rolling_back(),
        gradient_clip_val=0.5,
        gradient_clip_algorithm=algorithm,
        default_root_dir=tmp_path,
        logger=False,
    )
    model = RegressionModel()
    trainer.fit(model, loader())
    summary = scheduler_of(trainer).summary(trainer)
    assert summary["rollbacks"] >= 1 and summary["steps_total"] == 60
    assert torch.isfinite(flat_params(model)).all()


class ManualClipping(RegressionModel):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="value")
        opt.step()
        return loss


def test_manual_value_clipping_on_predicted_steps():
    trainer, _ = hybrid_trainer(40)
    model = ManualClipping(automatic=False)
    trainer.fit(model, loader())
    assert trainer.global_step == 40 and torch.isfinite(flat_params(model)).all()


class SparseEmbedding(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.head(self.embed((x.abs() * 10).long().clamp(max=49)).mean(1)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_sparse_gradients_are_refused_before_training_naming_the_parameter():
    trainer, _ = hybrid_trainer(10)
    model = SparseEmbedding()
    before = flat_params(model)
    with pytest.raises(MisconfigurationException, match=r"embed\.weight.*sparse"):
        trainer.fit(model, loader())
    assert trainer.global_step == 0 and torch.equal(before, flat_params(model))


def _ends_inside_a_segment(tmp_path, stop_early=False):
    """Plans that always blow up and are never checked by a forward pass: with training ending inside the first
    segment (max_steps, or a callback that stops the run as EarlyStopping and max_time do), only the end of fit
    can judge it."""

    class AlwaysExploding(SometimesExploding):
        def plan(self, horizon, features=None):
            plan = super(SometimesExploding, self).plan(horizon, features)
            plan.scales = [[s * 1e4 for s in row] for row in plan.scales]
            return plan

    scheduler = HybridScheduler(**{**FAST_PHASES, "predict_forward_every": 0})
    callbacks = [scheduler, DynamicsPredictor(AlwaysExploding()), ResidualCorrector(), DivergenceMonitor()]
    warmup, full = FAST_PHASES["warmup_steps"], FAST_PHASES["full_steps"]

    class StopsTheRun(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
            trainer.should_stop = trainer.should_stop or trainer.global_step == warmup + full + 2

    steps = 100 if stop_early else warmup + full + 2
    extra = [StopsTheRun()] if stop_early else []
    trainer, _ = hybrid_trainer(steps, hybrid=callbacks, extra_callbacks=extra, default_root_dir=tmp_path, logger=False)
    return trainer


@pytest.mark.parametrize("stop_early", [False, True], ids=["max_steps", "should_stop"])
def test_fit_never_ends_on_unverified_predicted_weights(tmp_path, stop_early):
    trainer = _ends_inside_a_segment(tmp_path, stop_early)
    model = RegressionModel()
    start = {}

    class SegmentStart(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, idx):
            if trainer.global_step == FAST_PHASES["warmup_steps"] + FAST_PHASES["full_steps"]:
                start["params"] = flat_params(pl_module)

    trainer.callbacks.append(SegmentStart())
    trainer.fit(model, loader())
    summary = scheduler_of(trainer).summary(trainer)
    assert summary["segments_started"] == 1 and summary["rollbacks"] == 1
    assert summary["rollback_reasons"]["end_of_fit"] == 1
    assert torch.equal(flat_params(model), start["params"])  # the weights the segment started from
    assert math.isfinite(float(nn.functional.mse_loss(model(torch.randn(4, 8)), torch.zeros(4, 1))))


class BatchNormModel(RegressionModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 1))


class BufferWatch(L.Callback):
    """The module's buffers at each segment's start, and whether they are back to those values after each
    rollback and at the first step after each accepted segment."""

    def __init__(self):
        self.at_start, self.last_phase, self.rollbacks = None, None, 0
        self.after_rollback, self.after_accepted = [], []

    def _buffers(self, module):
        return [b.detach().clone() for b in module.buffers()]

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        scheduler = scheduler_of(trainer)
        phase = scheduler.phase
        if phase.name == "PREDICT" and self.last_phase is not None and self.last_phase.name != "PREDICT":
            self.at_start = self._buffers(pl_module)
        if phase.name == "CORRECT" and self.last_phase.name == "PREDICT":
            now = self._buffers(pl_module)
            self.after_accepted.append(all(torch.equal(a, b) for a, b in zip(now, self.at_start)))
        self.last_phase = phase

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        scheduler = scheduler_of(trainer)
        if scheduler.counters.rollbacks > self.rollbacks:
            self.rollbacks = scheduler.counters.rollbacks
            now = self._buffers(pl_module)
            self.after_rollback.append(all(torch.equal(a, b) for a, b in zip(now, self.at_start)))


def test_a_rollback_restores_batchnorm_buffers_bitwise_and_checks_leave_no_trace():
    watch = BufferWatch()
    scheduler = HybridScheduler(**FAST_PHASES)  # a forward check on every predicted step after the first
    callbacks = [scheduler, DynamicsPredictor(SometimesExploding()), ResidualCorrector(), DivergenceMonitor()]
    trainer, _ = hybrid_trainer(80, hybrid=callbacks, extra_callbacks=[watch], logger=False)
    model = BatchNormModel()
    trainer.fit(model, loader())
    assert watch.after_rollback and all(watch.after_rollback)  # statistics written at blown-up weights are undone
    assert watch.after_accepted and all(watch.after_accepted)  # forward checks at predicted weights left no trace
    assert all(torch.isfinite(b.float()).all() for b in model.buffers())


class NanOnSecondCheck(L.LightningModule):
    """A BatchNorm CNN whose ``training_step`` returns a NaN loss on the second ``no_grad`` forward of every Predict
    segment (automatic optimization), or on its second predicted step (manual, where every predicted step runs
    the forward)."""

    def __init__(self, automatic: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(32, 1)
        )
        self.automatic_optimization = automatic
        self.checks = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x.view(-1, 1, 2, 4)), y)  # the 8 features as a 2x4 image
        self.checks = 0 if torch.is_grad_enabled() else self.checks + 1
        if self.checks == 2:
            loss = loss * math.nan
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class SegmentStart(L.Callback):
    """The weights and every buffer at each segment's start, and whether both are back there after each rollback."""

    def __init__(self):
        self.start, self.rollbacks, self.restored = None, 0, []

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        scheduler = scheduler_of(trainer)
        if scheduler.phase.name == "PREDICT" and scheduler.engine.machine.segment_pos == 0:
            self.start = [t.detach().clone() for t in [*pl_module.parameters(), *pl_module.buffers()]]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        rollbacks = scheduler_of(trainer).counters.rollbacks
        if rollbacks > self.rollbacks:
            self.rollbacks = rollbacks
            now = [*pl_module.parameters(), *pl_module.buffers()]
            self.restored.append([torch.equal(a, b) for a, b in zip(self.start, now)])


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_a_nan_loss_in_a_predicted_forward_rolls_batchnorm_back_bitwise(automatic):
    """Weights, running statistics and ``num_batches_tracked`` after the rollback all equal the segment's start."""
    watch = SegmentStart()
    trainer, _ = hybrid_trainer(60, extra_callbacks=[watch], logger=False)
    trainer.fit(NanOnSecondCheck(automatic), loader())
    assert len(watch.restored) >= 2 and all(all(row) for row in watch.restored), watch.restored
    assert scheduler_of(trainer).summary()["rollback_reasons"]["nonfinite"] == len(watch.restored)


class DictOutputs(RegressionModel):
    def training_step(self, batch, batch_idx):
        x, y = batch
        preds = self(x)
        return {"loss": nn.functional.mse_loss(preds, y), "preds": preds.detach()}


class ReadsPreds(L.Callback):
    """A train-metric callback as users write it, guarded by the documented contract."""

    def __init__(self):
        self.read, self.predicted = 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if is_predicted_step(outputs):
            self.predicted += 1
            assert torch.isfinite(outputs["loss"])
            return
        assert outputs["preds"].shape == batch[1].shape
        self.read += 1


@pytest.mark.parametrize("forward_every", [0, 2])  # no forward on predicted steps / a check on every second one
def test_a_callback_tells_predicted_steps_from_ordinary_ones_by_the_output(forward_every):
    reader = ReadsPreds()
    trainer, _ = hybrid_trainer(60, {"predict_forward_every": forward_every}, extra_callbacks=[reader], logger=False)
    trainer.fit(DictOutputs(), loader())
    scheduler = scheduler_of(trainer)
    summary = scheduler.summary()
    assert reader.predicted == summary["steps_by_phase"]["predict"] > 0
    assert reader.read == summary["steps_total"] - reader.predicted


class FreezeAt(L.Callback):
    """Freezes (or unfreezes) the first layer at a step, as progressive freezing does; records the phase each step
    starts in (by the step count at its start) and the first layer's weights after it (by the count at its end)."""

    def __init__(self, step, trainable):
        self.step, self.trainable, self.weights, self.phases = step, trainable, {}, {}

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        if trainer.global_step == self.step:
            pl_module.net[0].requires_grad_(self.trainable)
        scheduler = scheduler_of(trainer)
        self.phases[trainer.global_step] = scheduler.phase.name

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        self.weights[trainer.global_step] = pl_module.net[0].weight.detach().clone()

    def moved_by_predicted_steps(self, after: int) -> list[int]:
        """The predicted steps after ``after`` that changed the first layer."""
        last = max(self.weights)
        return [
            s for s, phase in self.phases.items()
            if phase == "PREDICT" and after < s < last and not torch.equal(self.weights[s + 1], self.weights[s])
        ]  # fmt: skip


class StartsFrozen(RegressionModel):
    def __init__(self):
        super().__init__()
        self.net[0].requires_grad_(False)


def test_a_parameter_frozen_during_fit_is_never_changed_by_prediction():
    freeze = FreezeAt(step=20, trainable=False)  # inside the second cycle
    trainer, _ = hybrid_trainer(80, extra_callbacks=[freeze], logger=False)
    trainer.fit(RegressionModel(), loader())
    frozen = [freeze.weights[s] for s in sorted(freeze.weights) if s > 20]
    assert all(torch.equal(w, freeze.weights[20]) for w in frozen)
    assert list(freeze.phases.values())[25:].count("PREDICT") > 0  # prediction went on for the rest


def test_a_parameter_unfrozen_during_fit_is_predicted_from_its_next_cycle():
    unfreeze = FreezeAt(step=20, trainable=True)
    trainer, _ = hybrid_trainer(80, extra_callbacks=[unfreeze], logger=False)
    trainer.fit(StartsFrozen(), loader())
    assert unfreeze.moved_by_predicted_steps(after=20), "the unfrozen layer was never moved by a predicted step"


def test_a_param_group_added_during_fit_is_predicted_from_its_next_cycle():
    class AddsGroup(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, idx):
            if trainer.global_step == 20:
                pl_module.net[0].requires_grad_(True)
                trainer.optimizers[0].add_param_group({"params": list(pl_module.net[0].parameters())})

    class BackboneFrozen(StartsFrozen):
        def configure_optimizers(self):
            return torch.optim.Adam(self.net[2].parameters(), lr=self.lr)

    watch = FreezeAt(step=-1, trainable=True)
    trainer, _ = hybrid_trainer(80, extra_callbacks=[AddsGroup(), watch], logger=False)
    trainer.fit(BackboneFrozen(), loader())
    assert watch.moved_by_predicted_steps(after=20), "the new param group was never moved by a predicted step"


def test_checkpoints_and_validation_inside_a_segment_are_marked(tmp_path, caplog):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.helpers import MemoryLogger, after_step, phases

    class ValidationSteps(L.Callback):
        steps: set = set()

        def on_validation_start(self, trainer, pl_module):
            self.steps.add(trainer.global_step)

    checkpoints = ModelCheckpoint(tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    logger, validations = MemoryLogger(), ValidationSteps()
    trainer, _ = hybrid_trainer(
        40, extra_callbacks=[checkpoints, validations], enable_checkpointing=True, logger=logger, val_check_interval=3,
        limit_val_batches=1,
    )  # fmt: skip
    with caplog.at_level("INFO"):
        trainer.fit(RegressionModel(), loader(), loader(64))
    marked = {}
    for path in tmp_path.glob("step=*.ckpt"):
        ckpt = torch.load(path, weights_only=True)  # a plain load finds the flag in the scheduler's state
        state = plugin_state(ckpt)
        assert is_unverified_checkpoint(ckpt) == state["unverified"]
        marked[path.name] = (state["unverified"], state["family"]["snapshot"] is not None)
    assert any(flag for flag, _ in marked.values()) and not all(flag for flag, _ in marked.values())
    assert all(holds_snapshot for flag, holds_snapshot in marked.values() if flag)  # resumable exactly
    said = [r for r in caplog.records if "holds a prediction awaiting its verdict" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "INFO"  # once a fit, however many such checkpoints: information
    assert (
        "Nothing to do to resume from it" in said[0].getMessage() and "is_unverified_checkpoint" in said[0].getMessage()
    )
    validated = validations.steps
    logged = after_step(logger, "hybrid/unverified")  # every validation, at its step: 1 unverified, 0 verified
    predict_steps = {s for s, phase in phases(logger).items() if phase == 2}
    unverified = {step for step, value in logged.items() if value == 1.0}
    assert set(logged) == validated and set(logged.values()) == {0.0, 1.0}
    assert unverified and unverified <= validated & predict_steps  # validated right after a predicted step
    flagged = next(tmp_path / name for name, (flag, _) in sorted(marked.items()) if flag)
    caplog.clear()
    with caplog.at_level("INFO"):
        hybrid_trainer(41, logger=False)[0].fit(RegressionModel(), loader(), ckpt_path=flagged)
    assert "resuming from a checkpoint whose weights were not yet verified" in caplog.text


# ------------------------------------------------------------------------ what already worked, pinned
class LrRecorder(L.Callback):
    def __init__(self):
        self.lrs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        self.lrs.append([group["lr"] for group in trainer.optimizers[0].param_groups])


class OneCycleGroups(RegressionModel):
    def configure_optimizers(self):
        groups = [
            {"params": self.net[0].parameters(), "lr": 1e-2, "weight_decay": 0.01},
            {"params": self.net[2].parameters(), "lr": 3e-3, "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[1e-2, 3e-3], total_steps=60)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def test_param_groups_under_one_cycle_see_plain_lightnings_lr_sequence():
    plain_lrs, hybrid_lrs = LrRecorder(), LrRecorder()
    L.Trainer(
        max_steps=60, accelerator="cpu", callbacks=[plain_lrs], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    ).fit(OneCycleGroups(), loader())  # fmt: skip
    trainer, _ = hybrid_trainer(60, extra_callbacks=[hybrid_lrs], logger=False)
    trainer.fit(OneCycleGroups(), loader())
    scheduler = scheduler_of(trainer)
    assert scheduler.counters.steps_by_phase["predict"] > 0
    assert hybrid_lrs.lrs == plain_lrs.lrs


class TiedWeights(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, 8, bias=False)
        self.back = nn.Linear(8, 8, bias=False)
        self.back.weight = self.inp.weight  # one Parameter in two modules, as GPT-2's lm_head and wte
        self.out = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.out(torch.tanh(self.back(torch.tanh(self.inp(x))))), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_tied_weights_stay_tied_and_are_stored_once():
    trainer, _ = hybrid_trainer(60, logger=False)
    model = TiedWeights()
    trainer.fit(model, loader())
    assert model.back.weight is model.inp.weight
    scheduler = scheduler_of(trainer)
    assert scheduler.counters.steps_by_phase["predict"] > 0 and torch.isfinite(flat_params(model)).all()
    assert len(trainer.optimizers[0].param_groups[0]["params"]) == len(list(model.parameters()))


def test_swa_plateau_scheduling_and_a_second_fit_keep_working():
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    class Plateau(RegressionModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=1e-2)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss"}}

    swa = StochasticWeightAveraging(swa_lrs=1e-3, swa_epoch_start=2)
    trainer, _ = hybrid_trainer(40, extra_callbacks=[swa], logger=False)
    model = Plateau()
    trainer.fit(model, loader())
    trainer.fit_loop.epoch_loop.max_steps = 60  # fit again on the same Trainer: the scheduler carries on
    trainer.fit(model, loader())
    scheduler = scheduler_of(trainer)
    assert trainer.global_step == 60 and scheduler.counters.steps_total == 60
    assert torch.isfinite(flat_params(model)).all()


@pytest.mark.gpu  # where the update average holds device memory
def test_the_update_average_waits_on_the_host_between_fits_on_cuda():
    """``linear``'s update average (one parameter copy) leaves the device when ``fit`` ends, as Lightning's optimizer
    state does, and the next ``fit`` of the same model takes it up again on the device, unchanged."""

    class FirstBatch(L.Callback):
        def on_train_batch_start(self, trainer, *args):
            if not hasattr(self, "seen"):
                self.seen = [[t.clone() for t in g] for g in _predictor(trainer).directions()]

    trainer, _ = hybrid_trainer(30, accelerator="cuda", devices=1, logger=False)
    model = RegressionModel()
    trainer.fit(model, loader())
    after = _predictor(trainer).directions()
    assert all(t.device.type == "cpu" for g in after for t in g) and any(t.abs().sum() > 0 for g in after for t in g)
    watch = FirstBatch()
    trainer.callbacks.append(watch)
    trainer.fit_loop.epoch_loop.max_steps = 40
    trainer.fit(model, loader())
    assert all(t.device.type == "cuda" for g in watch.seen for t in g)
    assert all(torch.equal(a.cpu(), b) for ga, gb in zip(watch.seen, after) for a, b in zip(ga, gb))


def _predictor(trainer):
    return next(cb for cb in trainer.callbacks if type(cb).__name__ == "DynamicsPredictor").predictor


def test_value_clipping_with_a_gradient_scaler_survives_skipped_steps():
    from lightning.pytorch.plugins.precision import MixedPrecision

    plugin = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    trainer, _ = hybrid_trainer(
        60, hybrid=_rolling_back(), gradient_clip_val=0.5, gradient_clip_algorithm="value", plugins=[plugin],
        logger=False,
    )  # fmt: skip
    model = RegressionModel()
    trainer.fit(model, loader())
    scheduler = scheduler_of(trainer)
    assert scheduler.counters.rollbacks >= 1 and trainer.global_step == 60
    assert torch.isfinite(flat_params(model)).all()


def test_a_modules_torchmetric_counts_only_the_batches_its_training_step_saw():
    from torchmetrics import MeanSquaredError

    class WithMetric(RegressionModel):
        def __init__(self):
            super().__init__()
            self.train_mse = MeanSquaredError()

        def training_step(self, batch, batch_idx):
            x, y = batch
            preds = self(x)
            self.train_mse.update(preds.detach(), y)
            return nn.functional.mse_loss(preds, y)

    trainer, _ = hybrid_trainer(60, {"predict_forward_every": 0}, logger=False)
    model = WithMetric()
    trainer.fit(model, loader())
    scheduler = scheduler_of(trainer)
    ordinary = scheduler.counters.steps_total - scheduler.counters.steps_by_phase["predict"]
    assert scheduler.counters.steps_by_phase["predict"] > 0
    assert int(model.train_mse.total) == ordinary * 32  # predicted steps without a forward add nothing
