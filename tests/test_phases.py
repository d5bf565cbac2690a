"""The phase cycle: what each phase costs, and that predicted steps count as steps."""

import json
import math
import os

import pytest
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_hybrid import Phase
from tests.helpers import (
    FAST,
    RegressionModel,
    StepRecorder,
    after_step,
    flat_params,
    hybrid_trainer,
    loader,
    phases,
    scheduler_of,
)


def test_phase_sequence_follows_the_cycle():
    trainer, logger = hybrid_trainer(max_steps=40)
    trainer.fit(RegressionModel(), loader())
    seq = [phases(logger)[s] for s in range(1, 41)]
    assert seq[:5] == [Phase.WARMUP] * 5
    assert seq[5:11] == [Phase.FULL] * 6
    # confidence_threshold=0: the predictor is ready after warmup + full, so a segment follows every Full cycle.
    first_predict = seq.index(Phase.PREDICT)
    assert first_predict == 11
    horizon = next(i for i in range(first_predict, 40) if seq[i] is not Phase.PREDICT) - first_predict
    assert 1 <= horizon <= FAST["max_predict_steps"]
    after = first_predict + horizon
    assert seq[after : after + 2] == [Phase.CORRECT] * 2
    assert seq[after + 2] is Phase.FULL
    assert set(seq) == set(Phase)


def test_backward_and_forward_passes_per_phase():
    recorder = StepRecorder()
    trainer, logger = hybrid_trainer(max_steps=60, extra_callbacks=[recorder])
    model = RegressionModel()
    trainer.fit(model, loader())
    steps = phases(logger)
    for step, phase in steps.items():
        if phase is Phase.PREDICT:
            assert recorder.backward[step] == 0, f"step {step} ran a backward pass while predicting"
        else:
            assert recorder.backward[step] == 1, f"step {step} ({phase.name}) should run exactly one backward"
    n_predict = sum(p is Phase.PREDICT for p in steps.values())
    assert n_predict >= 5
    assert model.backward_calls == 60 - n_predict
    summary = scheduler_of(trainer).summary()
    assert summary["backward_passes"] == model.backward_calls
    assert summary["steps_by_phase"]["predict"] == n_predict
    assert summary["backward_skipped_pct"] == pytest.approx(100 * n_predict / 60, abs=1e-3)


def test_predicted_forward_passes_run_without_grad_at_the_requested_interval():
    recorder = StepRecorder()
    trainer, logger = hybrid_trainer(max_steps=80, settings={"predict_forward_every": 2}, extra_callbacks=[recorder])
    model = RegressionModel()
    trainer.fit(model, loader())
    steps = phases(logger)
    predict_steps = [s for s, p in steps.items() if p is Phase.PREDICT]
    assert predict_steps
    positions, pos = {}, 0
    for s in sorted(steps):
        pos = pos + 1 if steps[s] is Phase.PREDICT and steps.get(s - 1) is Phase.PREDICT else 0
        positions[s] = pos
    for s in predict_steps:
        due = positions[s] > 0 and positions[s] % 2 == 0
        assert recorder.forward[s] == int(due), f"predicted step {s} at segment position {positions[s]}"
    # every forward pass with gradients belongs to an ordinary step
    assert model.forward_with_grad == sum(p is not Phase.PREDICT for p in steps.values())


def test_no_forward_at_all_when_predict_forward_every_is_zero():
    recorder = StepRecorder()
    trainer, logger = hybrid_trainer(max_steps=60, settings={"predict_forward_every": 0}, extra_callbacks=[recorder])
    trainer.fit(RegressionModel(), loader())
    predict_steps = [s for s, p in phases(logger).items() if p is Phase.PREDICT]
    assert predict_steps and all(recorder.forward[s] == 0 for s in predict_steps)


class _PtrWatch(Callback):
    def __init__(self):
        self.ptrs = None
        self.changed = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        ptrs = [p.data_ptr() for p in pl_module.parameters()]
        if self.ptrs is None:
            self.ptrs = ptrs
        elif ptrs != self.ptrs:
            self.changed.append(trainer.global_step)


def test_predicted_steps_hold_no_gradients():
    class GradWatch(Callback):
        held = []

        def on_train_batch_start(self, trainer, pl_module, batch, idx):
            self.predicting = scheduler_of(trainer).phase is Phase.PREDICT

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
            if self.predicting:
                self.held.append(any(p.grad is not None for p in pl_module.parameters()))

    watch = GradWatch()
    trainer, _ = hybrid_trainer(max_steps=60, extra_callbacks=[watch])
    trainer.fit(RegressionModel(), loader())
    assert len(watch.held) >= 5 and not any(watch.held)


def test_parameters_are_updated_in_place():
    watch = _PtrWatch()
    trainer, logger = hybrid_trainer(max_steps=60, extra_callbacks=[watch])
    trainer.fit(RegressionModel(), loader())
    assert Phase.PREDICT in phases(logger).values()
    assert watch.changed == []


def test_predicted_steps_move_the_weights():
    class Diff(Callback):
        moved = []

        def on_train_batch_start(self, trainer, pl_module, batch, idx):
            self.before = flat_params(pl_module)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
            if scheduler_of(trainer).summary()["steps_by_phase"]["predict"] > len(self.moved):
                self.moved.append(not torch.equal(self.before, flat_params(pl_module)))

    diff = Diff()
    trainer, _ = hybrid_trainer(max_steps=40, extra_callbacks=[diff])
    trainer.fit(RegressionModel(), loader())
    assert diff.moved and all(diff.moved)


def test_global_step_schedulers_and_checkpoints_count_predicted_steps(tmp_path):
    lr_monitor = LearningRateMonitor(logging_interval="step")
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=10, save_top_k=-1, filename="{step}")
    trainer, logger = hybrid_trainer(
        max_steps=50, extra_callbacks=[lr_monitor, ckpt], enable_checkpointing=True, val_check_interval=5
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(), loader(64))
    assert trainer.global_step == 50
    assert sum(p is Phase.PREDICT for p in phases(logger).values()) > 5
    # StepLR(gamma=0.99) stepped once per optimizer step, predicted ones included
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-2 * 0.99**50)
    assert sorted(os.listdir(tmp_path / "ckpt")) == sorted(f"step={s}.ckpt" for s in (10, 20, 30, 40, 50))
    # val_check_interval=5: validation after the 5th batch of each 8-batch epoch, as in plain Lightning
    assert len(logger.series("val_loss")) == 6


def test_summary_json_and_tensorboard_curves_in_log_dir(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, _ = hybrid_trainer(max_steps=30, logger=TensorBoardLogger(tmp_path))
    trainer.fit(RegressionModel(), loader())
    events = EventAccumulator(trainer.log_dir)
    events.Reload()
    assert [e.step for e in events.Scalars("hybrid/phase")] == list(range(30))  # Lightning's steps, from 0
    assert len(events.Scalars("hybrid/backward_skipped_pct")) == 30
    path = os.path.join(trainer.log_dir, "hybrid_summary.json")
    with open(path) as f:
        summary = json.load(f)
    for key in ("steps_total", "steps_by_phase", "backward_passes", "backward_skipped_pct", "rollbacks"):
        assert key in summary
    assert summary["steps_total"] == 30
    assert set(summary["steps_by_phase"]) == {"warmup", "full", "predict", "correct"}
    assert sum(summary["steps_by_phase"].values()) == 30
    assert set(summary["time_by_phase_s"]) == {"warmup", "full", "predict", "correct"}
    assert summary["wall_time_s"] >= sum(summary["time_by_phase_s"].values()) > 0


@pytest.mark.parametrize("summary_dir", [None, "named"])
def test_without_a_logger_the_summary_goes_only_where_the_user_names(tmp_path, monkeypatch, summary_dir):
    """Not the working directory, not ``default_root_dir`` (where ``ModelCheckpoint`` keeps its files without a
    logger), unless named; and nothing for a ``fit`` that trained no step."""
    import lightning as L

    from lightning_hybrid import HybridPredictStrategy, HybridScheduler, hybrid_callbacks

    monkeypatch.chdir(tmp_path)
    named = None if summary_dir is None else str(tmp_path / summary_dir)
    for max_epochs in (0, 1):
        callbacks = hybrid_callbacks(**FAST)
        callbacks[0] = HybridScheduler(callbacks[0].config, summary_dir=named)
        trainer = L.Trainer(
            max_epochs=max_epochs,
            max_steps=12,
            strategy=HybridPredictStrategy(),
            callbacks=callbacks,
            logger=False,
            enable_progress_bar=False,
            default_root_dir=tmp_path / "root",
        )
        trainer.fit(RegressionModel(), loader())
        written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("hybrid_summary.json"))
        if max_epochs == 0 or named is None:
            assert not written
    assert written == [f"{summary_dir}/hybrid_summary.json"] if named else not written
    assert not any(p.name == "hybrid_summary.json" for p in (tmp_path / "root").rglob("*"))


def test_every_step_logs_the_phase_curves():
    trainer, logger = hybrid_trainer(max_steps=40)
    trainer.fit(RegressionModel(), loader())
    for key in (
        "hybrid/phase",
        "hybrid/confidence",
        "hybrid/horizon",
        "hybrid/rollbacks",
        "hybrid/backward_skipped_pct",
    ):
        assert sorted(logger.series(key)) == list(range(40)), key
    steps = phases(logger)
    finite = lambda tag: {s for s, v in after_step(logger, tag).items() if math.isfinite(v)}  # noqa: E731
    ordinary = [s for s, p in steps.items() if p is not Phase.PREDICT]
    assert set(ordinary) <= finite("hybrid/loss")
    horizon = after_step(logger, "hybrid/horizon")
    assert all((horizon[s] > 0) == (p is Phase.PREDICT) for s, p in steps.items())
    assert {s for s, p in steps.items() if p is Phase.PREDICT} <= finite("hybrid/loss_predicted")


def test_learned_dynamics_curves_and_summary_fields():
    settings = {
        "predictor": "mlp",
        "bandit": True,
        "cost": "steps",
        "train_every": 2,
        "batch_size": 4,
        "backoff_after": 0,
    }
    trainer, logger = hybrid_trainer(max_steps=80, settings=settings)
    trainer.fit(RegressionModel(), loader())
    for key in ("correction_magnitude", "uncertainty", "bandit_arm"):
        assert sorted(logger.series(f"hybrid/{key}")) == list(range(80)), key
    errors = {s for s, v in after_step(logger, "hybrid/prediction_error").items() if math.isfinite(v)}
    seq = phases(logger)
    missing = [s for s, p in seq.items() if p is not Phase.PREDICT and s not in errors]
    # only the first Correct step of a segment has no captured update: it verifies the segment instead
    assert all(seq[s] is Phase.CORRECT and seq[s - 1] is Phase.PREDICT for s in missing)
    summary = scheduler_of(trainer).summary()
    assert summary["predictor"] == "mlp"
    assert 0 <= summary["mean_prediction_error"] < 10
    assert set(summary["arm_counts"]) == {"0", "2", "4"} and sum(summary["arm_counts"].values()) > 0
