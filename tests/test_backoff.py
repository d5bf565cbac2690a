"""Back-off: when Full cycles keep ending without a segment, the plugin stops capturing updates and training the
predictor for growing pauses, and a run that never predicts pays no capture at all."""

import itertools

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import DynamicsPredictor, Phase
from tests.helpers import FAST, RegressionModel, flat_params, hybrid_trainer, loader, phases, scheduler_of


def _spy_observations(trainer) -> list[bool]:
    """Per ordinary step, whether the predictor received the captured update."""
    predictor = next(cb for cb in trainer.callbacks if isinstance(cb, DynamicsPredictor)).predictor
    seen: list[bool] = []
    observe = predictor.observe

    def spy(step, loss, deltas, features=None):
        seen.append(deltas is not None)
        return observe(step, loss, deltas, features)

    predictor.observe = spy
    return seen


def _runs(flags: list[bool]) -> list[tuple[bool, int]]:
    return [(flag, len(list(group))) for flag, group in itertools.groupby(flags)]


def test_declined_cycles_back_off_with_doubling_pauses():
    full = FAST["full_steps"]
    trainer, _ = hybrid_trainer(130, {"confidence_threshold": 1.0, "backoff_after": 2})  # never confident
    seen = _spy_observations(trainer)
    trainer.fit(RegressionModel(), loader(1024))
    runs = _runs(seen)
    assert runs[0] == (True, FAST["warmup_steps"] + 2 * full)  # warmup, then two declined Full cycles
    pauses = [n for flag, n in runs if not flag]
    observed = [n for flag, n in runs[1:] if flag]
    assert pauses[:3] == [full, 2 * full, 4 * full]
    assert observed[:2] == [full, full]  # after a pause, one declined cycle starts the next pause
    summary = scheduler_of(trainer).summary()
    assert summary["backed_off_steps"] == seen.count(False)
    assert summary["segments_started"] == 0


def test_without_prediction_no_update_is_ever_captured_and_training_is_plain():
    trainer, _ = hybrid_trainer(40, {"enable_prediction": False})
    seen = _spy_observations(trainer)
    model = RegressionModel()
    trainer.fit(model, loader())
    assert seen and not any(seen)
    assert scheduler_of(trainer).summary()["backed_off_steps"] == 40
    plain_trainer, _ = hybrid_trainer(40, {"enable_prediction": False, "backoff_after": 0})
    plain = RegressionModel()
    plain_trainer.fit(plain, loader())
    assert torch.equal(flat_params(model), flat_params(plain))


def test_resuming_inside_a_back_off_continues_it_exactly(tmp_path):
    settings = {"confidence_threshold": 1.0, "backoff_after": 2}
    ckpt = ModelCheckpoint(tmp_path, every_n_train_steps=8, save_top_k=-1, filename="{step}")  # epoch ends
    trainer, _ = hybrid_trainer(64, settings, extra_callbacks=[ckpt], enable_checkpointing=True)
    full_model = RegressionModel()
    trainer.fit(full_model, loader())
    uninterrupted = scheduler_of(trainer).summary()
    assert uninterrupted["backed_off_steps"] > 0
    resumed_trainer, _ = hybrid_trainer(64, settings)
    resumed_model = RegressionModel()
    resumed_trainer.fit(resumed_model, loader(), ckpt_path=tmp_path / "step=24.ckpt")  # paused at step 24
    assert scheduler_of(resumed_trainer).summary()["backed_off_steps"] == uninterrupted["backed_off_steps"]
    assert torch.equal(flat_params(resumed_model), flat_params(full_model))


def _lr_gated_run(
    max_steps: int, fraction: float = 0.8, trainer_kwargs: dict | None = None, **fit_kwargs
) -> tuple[RegressionModel, list[bool], dict[int, Phase], int]:
    """A run whose learning rate decays by 1% a step, gated at ``fraction`` of its peak."""
    trainer, logger = hybrid_trainer(max_steps, {"predict_lr_fraction": fraction}, **(trainer_kwargs or {}))
    seen = _spy_observations(trainer)
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(), **fit_kwargs)
    return model, seen, phases(logger), scheduler_of(trainer).summary()["backed_off_steps"]


def test_lr_gate_waits_for_the_learning_rate_to_decay():
    opens = next(t for t in range(100) if 0.99**t <= 0.8)  # the LR after t scheduler steps is 0.99**t of its peak
    _, seen, by_step, backed_off = _lr_gated_run(60)
    assert seen[:opens] == [False] * opens  # nothing captured, the predictor learns nothing
    assert all(seen[opens : opens + FAST["full_steps"]])  # then Full cycles observe as usual
    predicted = [step for step, phase in by_step.items() if phase is Phase.PREDICT]
    assert predicted and min(predicted) > opens + FAST["warmup_steps"]
    assert backed_off == opens
    _, _, ungated, _ = _lr_gated_run(60, fraction=1.0)
    assert min(step for step, phase in ungated.items() if phase is Phase.PREDICT) < opens  # the gate delayed it


def test_resuming_before_the_lr_gate_opens_keeps_the_peak(tmp_path):
    ckpt = ModelCheckpoint(tmp_path, every_n_train_steps=8, save_top_k=-1, filename="{step}")
    full_model, _, full_phases, _ = _lr_gated_run(
        48, trainer_kwargs={"extra_callbacks": [ckpt], "enable_checkpointing": True}
    )
    resumed_model, _, resumed_phases, _ = _lr_gated_run(48, ckpt_path=tmp_path / "step=16.ckpt")
    assert {s: p for s, p in full_phases.items() if s > 16} == resumed_phases
    assert torch.equal(flat_params(resumed_model), flat_params(full_model))
