"""Back-off: when Full cycles keep ending without a segment, the plugin stops capturing updates and training the
predictor for growing pauses, and a run that never predicts pays no capture at all."""

import itertools

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import DynamicsPredictor
from tests.helpers import FAST, RegressionModel, flat_params, hybrid_trainer, loader, scheduler_of


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
    assert observed[:2] == [2 * full, 2 * full]  # two more declined cycles before each further back-off
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
