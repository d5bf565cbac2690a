"""What the plugin says around a fit, in the words of the mode that runs: warnings before training (settings the mode
does not read, a fit too short to predict anything, a component it does not use), no notice about components it
does not use, and the end-of-fit text."""

import logging
import sys
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

from lightning_hybrid import DivergenceMonitor, HybridScheduler, ResidualCorrector, hybrid_callbacks
from tests.helpers import RegressionModel, hybrid_trainer, loader, scheduler_of, users_trainer

IGNORED = "belongs to the per-step mode"


def _fit(callbacks, steps=30, model=None, **kwargs):
    trainer, _ = hybrid_trainer(steps, hybrid=callbacks, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model or RegressionModel(), loader())
    return trainer, [str(w.message) for w in caught]


def test_a_per_step_setting_given_to_the_scheduler_alone_warns_once_before_training():
    """The LightningCLI path: the scheduler alone, a per-step setting among its init_args: said as it is built
    (as ``hybrid_callbacks`` says it), not again at fit."""
    with pytest.warns(UserWarning, match="`max_predict_steps` belongs to the per-step mode"):
        scheduler = HybridScheduler(max_predict_steps=5, warmup_steps=5, full_steps=10)
    _, said = _fit([scheduler])
    assert not [m for m in said if IGNORED in m]


def test_hybrid_callbacks_warns_once_not_again_at_fit():
    with pytest.warns(UserWarning, match=IGNORED):
        callbacks = hybrid_callbacks(max_predict_steps=5, warmup_steps=5, full_steps=10)
    _, said = _fit(callbacks)
    assert not [m for m in said if IGNORED in m]


def test_a_monitor_setting_the_default_does_not_read_warns():
    _, said = _fit([HybridScheduler(warmup_steps=5, full_steps=10), DivergenceMonitor(oscillation_window=2)])
    assert [m for m in said if "`oscillation_window` belongs to the per-step mode" in m]


def test_a_residual_corrector_listed_under_the_default_is_said_unused_and_left_out():
    trainer, said = _fit([HybridScheduler(warmup_steps=5, full_steps=10), ResidualCorrector()])
    assert [m for m in said if "ResidualCorrector is a component of the per-step mode" in m]
    assert scheduler_of(trainer).engine.parts.corrector is None


def test_the_default_built_from_the_scheduler_alone_names_no_component(caplog):
    with caplog.at_level(logging.INFO):
        trainer, said = _fit([HybridScheduler(warmup_steps=5, full_steps=10)])
    assert "ResidualCorrector" not in caplog.text and not [m for m in said if "ResidualCorrector" in m]
    assert scheduler_of(trainer).summary()["jumps_made"] >= 0


@pytest.mark.parametrize(
    ("settings", "steps", "first"),
    [
        ({}, 50, 140),  # the README's warmup_steps=100 in a run of 50: 100 + 20 for the cycle + 20 for its verdict
        ({"warmup_steps": 10, "full_steps": 10, "verify_window": 0}, 15, 20),  # nothing to verify: one cycle
        ({"predictor": "linear", "warmup_steps": 20, "full_steps": 10}, 25, 30),
    ],
)
def test_a_fit_too_short_for_any_prediction_warns_before_training(settings, steps, first):
    class Noting(RegressionModel):
        def training_step(self, batch, batch_idx):
            self.said_before_training = self.said_before_training or [str(w.message) for w in caught]
            return super().training_step(batch, batch_idx)

    model = Noting()
    model.said_before_training = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, _ = hybrid_trainer(steps, hybrid=hybrid_callbacks(**settings))
        trainer.fit(model, loader())
    short = [m for m in model.said_before_training if "before step" in m]
    assert len(short) == 1 and f"this fit ends at step {steps}, before step {first}" in short[0]


def test_a_fit_long_enough_or_without_prediction_does_not_warn():
    _, said = _fit(hybrid_callbacks(warmup_steps=5, full_steps=10), steps=30)
    assert not [m for m in said if "before step" in m]
    _, said = _fit(hybrid_callbacks(enable_prediction=False), steps=30)
    assert not [m for m in said if "before step" in m]


def test_prediction_switched_off_is_said_as_such():
    trainer, _ = _fit(hybrid_callbacks(enable_prediction=False, warmup_steps=5, full_steps=10))
    text = scheduler_of(trainer).report()
    assert "jumps switched off (enable_prediction=False)" in text and "backed off" not in text
    trainer, _ = _fit(hybrid_callbacks(predictor="linear", enable_prediction=False, warmup_steps=5, full_steps=10))
    text = scheduler_of(trainer).report()
    assert "prediction switched off (enable_prediction=False)" in text and "backed off" not in text


def test_the_text_counts_with_correct_plurals():
    trainer, _ = _fit(hybrid_callbacks(warmup_steps=5, full_steps=6, verify_window=3, verify_resolution=0.0), 30)
    made = scheduler_of(trainer).counters.jumps_made
    text = scheduler_of(trainer).report()
    assert (
        made > 1
        and f"{made} jumps made" in text
        and "30 steps: 5 in the plugin's warm-up (warmup_steps), 25 full" in text
    )
    trainer, _ = _fit(hybrid_callbacks(warmup_steps=5, full_steps=6, verify_window=3, verify_resolution=0.0), 18)
    assert "1 jump made" in scheduler_of(trainer).report()


class WarmedUp(RegressionModel):
    """A linear learning-rate warm-up over the first 30 steps, as users write one."""

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 30))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def test_a_message_during_training_is_on_a_line_of_its_own_beside_the_progress_bar(capsys):
    """The rising-rate message, said while Lightning's TQDM bar is drawn on the same stream: the bar is cleared
    first (its line ends in a carriage return, not in the message), and drawn again after."""
    handler = logging.StreamHandler(sys.stdout)  # the stream the bar draws on, as on a terminal
    logging.getLogger("lightning.pytorch").addHandler(handler)
    try:
        trainer, _ = hybrid_trainer(40, hybrid=hybrid_callbacks(warmup_steps=2, full_steps=5), logger=False)
        trainer.callbacks.append(TQDMProgressBar())
        trainer.fit(WarmedUp(), loader())
    finally:
        logging.getLogger("lightning.pytorch").removeHandler(handler)
    out = capsys.readouterr().out
    said = out.index("hybrid: no jump while the learning rate rises")
    assert "it/s" in out[:said] and out[said - 1] == "\r" and out[said:].split("\n", 1)[1].strip()


def test_the_per_step_mode_says_why_it_made_no_segment(caplog):
    """A per-step run whose predictor never earns the confidence to predict, behind a learning-rate gate first: the
    end of fit gives the steps backed off by reason and the confidence's peak against the threshold."""
    settings = {"predictor": "linear", "bandit": False, "warmup_steps": 5, "full_steps": 6, "backoff_after": 1}
    callbacks = hybrid_callbacks(**settings, confidence_threshold=1.0, predict_lr_fraction=0.9)
    with caplog.at_level(logging.INFO):
        trainer, _ = _fit(callbacks, 60, RegressionModel(scheduler=True), logger=False)  # 0.99 a step: gated 11
    summary = scheduler_of(trainer).summary()
    gated, paused = summary["backed_off_by"]["learning_rate"], summary["backed_off_by"]["paused"]
    assert summary["segments_started"] == 0 and gated > 0 and paused > 0
    assert gated + paused == summary["backed_off_steps"] and 0 < summary["confidence_peak"] < 1.0
    assert (
        f"of the steps backed off, {gated} waited for the learning rate to fall to predict_lr_fraction=0.9 of its "
        f"peak; {paused} paused after Full cycles that ended without a segment" in caplog.text
    )
    assert (
        f"no Predict segment: the predictor's confidence reached {summary['confidence_peak']:.2f} at most, under "
        "confidence_threshold=1.0" in caplog.text
    )


def test_a_resumed_fits_text_says_the_counts_run_from_the_start_and_what_this_fit_ran(tmp_path):
    """``fit(ckpt_path=...)`` from step 16 of 32: the counts are the whole run's, and the text says so and what this
    process ran; the time shares are this fit's own (a first process's phases are not this one's)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    settings = dict(warmup_steps=5, full_steps=6, verify_window=3, verify_resolution=0.0)
    saving = ModelCheckpoint(tmp_path, every_n_train_steps=16, save_top_k=-1, filename="{step}")
    trainer, _ = _fit(hybrid_callbacks(**settings), 16, extra_callbacks=[saving], enable_checkpointing=True)
    assert "since training began" not in scheduler_of(trainer).report()
    resumed, _ = hybrid_trainer(32, hybrid=hybrid_callbacks(**settings))
    resumed.fit(RegressionModel(), loader(), ckpt_path=tmp_path / "step=16.ckpt")
    text = scheduler_of(resumed).report()
    head = "hybrid (jumps, outer): 32 steps since training began: 5 in the plugin's warm-up (warmup_steps), 27 full;"
    assert head + " this fit resumed at step 16 and ran 16 (16 full)" in text
    assert "hybrid: this fit's step time by phase: warmup 0%, full 100%" in text


def test_a_plain_checkpoint_resumed_under_the_plugin_counts_its_warm_up_from_the_resume(tmp_path, caplog):
    """A plain run's checkpoint at step 30 resumed under the plugin to step 36 once printed "(warmup 6, full 0)"
    with no warning (the check compared absolute steps). The plugin starts there: what this fit will do is said as
    it starts, the short fit warned about, the counts given from the resumed step; a longer fit jumps."""
    import lightning as L

    settings = dict(warmup_steps=4, full_steps=6, verify_window=3, verify_resolution=0.0)
    plain = L.Trainer(max_steps=30, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    plain.fit(RegressionModel(), loader())
    plain.save_checkpoint(tmp_path / "plain.ckpt")
    short, _ = hybrid_trainer(36, hybrid=hybrid_callbacks(**settings))
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short.fit(RegressionModel(), loader(), ckpt_path=tmp_path / "plain.ckpt")
    assert "this fit resumes at step 30 from a checkpoint without the plugin's state" in caplog.text
    assert "(warmup_steps=4) counted from step 30; its first prediction can be made and judged by step 46" in (
        caplog.text
    )
    said = [str(w.message) for w in caught if "before step 46" in str(w.message)]
    assert len(said) == 1 and "this fit ends at step 36" in said[0] and "counted from step 30" in said[0]
    head = "hybrid (jumps, outer): 6 steps from step 30, where this fit resumed a checkpoint without the plugin's "
    assert head + "state: 4 in the plugin's warm-up (warmup_steps), 2 full" in scheduler_of(short).report()
    longer, _ = hybrid_trainer(60, hybrid=hybrid_callbacks(**settings))
    longer.fit(RegressionModel(), loader(), ckpt_path=tmp_path / "plain.ckpt")
    summary = scheduler_of(longer).summary()
    assert summary["steps_by_phase"]["warmup"] == 4 and summary["jumps_made"] >= 1


def test_the_bar_shows_the_share_skipped_as_of_each_decision_however_the_callbacks_are_ordered():
    """The app lists its progress bar before the hybrid callbacks, so the bar ends each batch first: from the next
    batch on, it shows the share of backward passes skipped as of the plugin's last decision, and the fit's last
    rendering shows the last one's."""
    import lightning as L

    from lightning_hybrid import HybridPredictStrategy, HybridProgressBar
    from tests.helpers import FAST

    shown, decided = {}, {}

    class Bar(HybridProgressBar):
        def on_train_batch_end(self, trainer, pl_module, *args):
            super().on_train_batch_end(trainer, pl_module, *args)
            shown[trainer.global_step] = self.get_metrics(trainer, pl_module).get("skipped")

    class After(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            engine = scheduler_of(trainer).engine
            if engine.decided:
                decided[trainer.global_step] = round(engine.record.counters.backward_skipped_pct, 1)

    bar = Bar()
    trainer = L.Trainer(max_steps=45, strategy=HybridPredictStrategy(), accelerator="cpu", logger=False,
                        callbacks=[bar, *hybrid_callbacks(**FAST), After()], enable_checkpointing=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(RegressionModel(), loader())
    assert scheduler_of(trainer).counters.backward_skipped > 0 and len(decided) > 3
    for step, share in decided.items():  # a decision at a step's end shows from the next step's end
        assert shown.get(step + 1, share) == pytest.approx(share)  # logged as a float32 tensor
    assert f"skipped={share}" in str(bar.train_progress_bar.postfix)  # the last decision's, rendered


def test_a_fit_with_nothing_left_to_train_says_nothing_and_an_average_of_no_step_claims_nothing(caplog):
    """A second ``fit`` of the same Trainer, its ``max_steps`` already reached, trains no step: no summary, not the
    first fit's again. Primal averaging that never started (a fit shorter than its warm-up) says so, and does not
    claim that validation saw an average."""
    trainer = users_trainer([HybridScheduler(warmup_steps=5, full_steps=6)], 20)
    model = RegressionModel()
    with caplog.at_level(logging.INFO):
        trainer.fit(model, loader())
    assert caplog.text.count("hybrid (jumps, outer): 20 steps") == 1
    caplog.clear()
    with caplog.at_level(logging.INFO):
        trainer.fit(model, loader())  # max_steps reached: nothing to train
    assert "hybrid" not in caplog.text
    short = users_trainer([HybridScheduler(predictor="gpa", warmup_steps=50)], 20)
    with caplog.at_level(logging.INFO):
        short.fit(RegressionModel(), loader())
    assert "averaged no step: validation, checkpoints and the end of fit saw the weights trained" in caplog.text
    assert "see the average" not in caplog.text
