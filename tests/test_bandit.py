"""HorizonBandit: LinUCB learns which horizon pays, and backs off to plain training when none does."""

import lightning as L
import torch

from lightning_hybrid import HybridPredictStrategy, hybrid_callbacks
from lightning_hybrid.algorithms import LinUCBHorizons
from lightning_hybrid.predictors import LinearPredictor
from tests.helpers import RegressionModel, flat_params, loader


def test_arms_are_capped_and_include_zero_and_the_maximum():
    bandit = LinUCBHorizons(arms=(2, 4, 8, 16))
    bandit.setup_arms(10, 4)
    assert bandit.horizons == [0, 2, 4, 8, 10]


def test_regret_falls_on_a_synthetic_contextual_bandit():
    g = torch.Generator().manual_seed(0)
    bandit = LinUCBHorizons(arms=(0, 1, 2, 3), alpha=0.5, exploration_plays=10**9)  # plain LinUCB
    bandit.setup_arms(3, 5)
    theta = torch.randn(4, 5, generator=g)
    regrets = []
    for _ in range(600):
        x = torch.randn(5, generator=g)
        means = theta @ x
        means[0] = 0.0  # arm 0 is the baseline: known reward 0
        arm = bandit.choose(x)
        regrets.append(float(means.max() - means[arm]))
        bandit.update(arm, x, float(means[arm] + 0.1 * torch.randn((), generator=g)))
    early, late = sum(regrets[:100]) / 100, sum(regrets[-100:]) / 100
    assert late < 0.5 * early, (early, late)


def test_reward_compares_progress_with_ordinary_steps():
    bandit = LinUCBHorizons(cost="steps", predict_cost=0.25)
    bandit.setup_arms(8, 3)
    for loss in (2.02, 2.01, 2.0, 1.99, 1.98):  # ordinary steps cost 1; their mean loss is 2.0
        bandit.record_step(predicted=False, seconds=0.0, loss=loss, correcting=False)
    bandit.begin(arm=1, features=torch.zeros(3), loss_slope=-0.01, loss_noise=0.0)
    for _ in range(8):
        bandit.record_step(predicted=True, seconds=0.0, loss=None, correcting=False)
    for loss in (1.91, 1.89):
        bandit.record_step(predicted=False, seconds=0.0, loss=loss, correcting=True)
    # progress 0.1 between window centres 8 * 0.25 + 2 + (5 - 2) / 2 = 5.5 ordinary steps apart (worth 0.055)
    assert abs(bandit.finish() - (0.1 - 0.055) / 0.055) < 1e-9
    assert bandit.horizons == [0, 2, 4, 8] and bandit.counts == [0, 1, 0, 0]


class Useless(LinearPredictor):
    """Each predicted step moves one average update backwards: predicted steps undo training."""

    def scales(self):
        return [-1.0] * len(self._num)

    def _clip_scale(self, value):
        return value


def _fit(callbacks):
    model = RegressionModel(optimizer="sgd", lr=0.05)  # still improving after 400 steps
    trainer = L.Trainer(
        max_steps=400,
        strategy=HybridPredictStrategy() if callbacks else "auto",
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    data = loader(512)
    trainer.fit(model, data)
    val = trainer.validate(model, loader(128, seed=2), verbose=False)[0]["val_loss"]
    return model, trainer, val


def test_a_useless_predictor_backs_off_to_nearly_plain_training():
    _, _, plain = _fit([])
    callbacks = hybrid_callbacks(
        predictor="linear",
        warmup_steps=20,
        full_steps=10,
        max_predict_steps=8,
        confidence_threshold=0.0,
        cost="steps",
        predict_lr_fraction=1.0,
    )
    callbacks[1].predictor = Useless()
    model, _trainer, hybrid = _fit(callbacks)
    summary = callbacks[0].summary()
    assert summary["steps_by_phase"]["predict"] <= 0.10 * summary["steps_total"]
    assert abs(hybrid - plain) <= 0.02 * plain, (hybrid, plain)
    assert summary["arm_counts"]["0"] > sum(v for k, v in summary["arm_counts"].items() if k != "0")
    assert torch.isfinite(flat_params(model)).all()
