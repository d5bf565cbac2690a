"""ResidualCorrector: similarity-weighted corrections lower prediction error; micro-corrections re-anchor."""

import math

import pytest
import torch

from lightning_hybrid import DivergenceMonitor, DynamicsPredictor, HybridScheduler, ResidualCorrector
from lightning_hybrid.algorithms import ResidualCorrection
from lightning_hybrid.predictors import LinearPredictor, Plan, UpdateStats
from tests.helpers import FAST_PHASES, RegressionModel, hybrid_trainer, loader


def _stats(predicted_scale: float, actual_scale: float = 1.0) -> UpdateStats:
    """A prediction ``predicted_scale * m`` of an update ``actual_scale * m`` with ``||m|| = 1``."""
    return UpdateStats(
        actual_sq=[actual_scale**2],
        predicted_sq=[predicted_scale**2],
        dot=[predicted_scale * actual_scale],
        loss=1.0,
        predicted_loss=0.9,
    )


def test_a_systematic_overshoot_is_corrected():
    corrector = ResidualCorrection(max_correction_factor=4.0)
    features = torch.zeros(8)
    for step in range(10):
        corrector.observe(step, _stats(predicted_scale=3.0), features)
    factors, offset = corrector.correction(features, 10, 1)
    assert math.isclose(factors[0], 1 / 3, rel_tol=1e-6)
    assert math.isclose(offset, 0.1, rel_tol=1e-6)
    assert _stats(3.0).scaled(factors).relative_error < 1e-6 < _stats(3.0).relative_error


def test_similar_states_weigh_more_and_old_residuals_fade():
    corrector = ResidualCorrection(max_correction_factor=4.0, neighbours=2, bandwidth=0.5, time_decay=0.9)
    here, there = torch.zeros(8), torch.full((8,), 3.0)
    corrector.observe(0, _stats(2.0), here)  # in this state the predictor overshoots by 2
    corrector.observe(0, _stats(0.5), there)  # elsewhere it undershoots
    assert corrector.correction(here, 1, 1)[0][0] < 0.6
    assert corrector.correction(there, 1, 1)[0][0] > 1.6
    corrector.observe(50, _stats(0.5), here)  # a recent residual outweighs an old one in the same state
    assert corrector.correction(here, 51, 1)[0][0] > 1.5


def test_corrections_are_clipped_and_empty_store_changes_nothing():
    corrector = ResidualCorrection(max_correction_factor=2.0)
    plan = Plan(scales=[[1.0, 1.0]], loss=[1.0, 0.9], loss_upper=[1.5, 1.4], confidence=0.5)
    assert corrector.correct(plan, torch.zeros(4), 0) == (plan, [1.0, 1.0])
    corrector.observe(0, UpdateStats([1.0, 1.0], [1.0, 1.0], [100.0, -1.0], 1.0, 1.0), torch.zeros(4))
    corrected, factors = corrector.correct(plan, torch.zeros(4), 1)
    assert factors == [2.0, 0.5]
    assert corrected.scales == [[2.0, 0.5]]


def test_reanchor_moves_the_rest_of_the_trajectory_and_only_tightens_the_bound():
    corrector = ResidualCorrection(correction_interval=2)
    plan = Plan(scales=[[1.0]] * 4, loss=[1.0, 0.9, 0.8, 0.7, 0.6], loss_upper=[2.0] * 5, confidence=1.0)
    assert corrector.reanchor(plan, 1, 5.0) is plan  # not a correction step
    up = corrector.reanchor(plan, 2, 1.0)  # measured 0.2 above the plan
    assert up.loss == pytest.approx([1.0, 0.9, 0.8, 0.9, 0.8]) and up.loss_upper == [2.0] * 5
    down = corrector.reanchor(plan, 2, 0.5)  # measured 0.3 below
    assert down.loss[3:] == pytest.approx([0.4, 0.3]) and down.loss_upper[3:] == pytest.approx([1.7, 1.7])


class Overshooting(LinearPredictor):
    """The linear predictor with every scale tripled: a systematic bias."""

    def scales(self):
        return [3 * s for s in super().scales()]


def _mean_error(max_correction_factor: float) -> float:
    callbacks = [
        HybridScheduler(**{**FAST_PHASES, "max_predict_steps": 2}),
        DynamicsPredictor(Overshooting(max_scale=10.0)),
        ResidualCorrector(max_correction_factor=max_correction_factor),
        DivergenceMonitor(z_threshold=50.0),
    ]
    trainer, _ = hybrid_trainer(150, hybrid=callbacks)
    trainer.fit(RegressionModel(lr=3e-3), loader())
    return callbacks[0].summary()["mean_prediction_error"]


def test_ablation_the_corrector_lowers_prediction_error_under_a_systematic_bias():
    without = _mean_error(max_correction_factor=1.0)  # factors pinned at 1: no correction
    with_corrector = _mean_error(max_correction_factor=4.0)
    assert with_corrector < 0.8 * without, (with_corrector, without)
