"""The learned predictors on synthetic update streams whose dynamics depend on the state."""

import math

import pytest
import torch

from lightning_hybrid.predictors import LinearPredictor, MLPPredictor, RSSMPredictor, build_predictor

DIM = 8


def _stream(steps, seed=0):
    """Updates along a fixed direction whose size follows a known cycle that the features reveal.

    ``delta_t = a_t * d`` with ``a_t = 1 + 0.8 * sin(t / 3)``; the features before step ``t`` hold
    ``sin(t / 3)`` and ``cos(t / 3)``. The best constant scale cannot follow ``a_t``; a model of the state can.
    """
    g = torch.Generator().manual_seed(seed)
    direction = [[torch.randn(6, 4, generator=g), torch.randn(4, generator=g)], [torch.randn(5, generator=g)]]
    for t in range(steps):
        a = 1.0 + 0.8 * math.sin(t / 3)
        features = torch.zeros(DIM)
        features[0], features[1] = math.sin(t / 3), math.cos(t / 3)
        deltas = [[0.01 * a * d for d in group] for group in direction]
        yield t, 2.0 - 0.001 * t, deltas, features


def _late_error(predictor, steps=600):
    predictor.setup([[torch.zeros(6, 4), torch.zeros(4)], [torch.zeros(5)]], DIM)
    errors = [predictor.observe(t, loss, deltas, f).relative_error for t, loss, deltas, f in _stream(steps)]
    return sum(errors[-100:]) / 100


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_mlp_predictor_beats_the_constant_scale_for_every_seed(seed):
    """Measured on this stream over seeds 0-4: 0.35-0.41 of the constant scale's error. The bound leaves room for
    other CPUs' kernels, whose last bits change a learned model's trajectory."""
    baseline = _late_error(LinearPredictor(decay=0.5))
    predictor = MLPPredictor(lr=1e-2, train_every=1, decay=0.5, seed=seed)
    learned = _late_error(predictor)
    assert predictor.train_steps > 50
    assert learned < 0.6 * baseline, (learned, baseline)


def test_the_rssm_predictor_trains_and_stays_finite():
    """The RSSM does not reliably beat the constant scale on this stream: over seeds 0-4 its error was 0.75, 1.16,
    1.11, 1.07 and 1.11 of the constant scale's (an earlier test that asserted 0.8 held for seed 0 alone, and not on
    every CPU). What holds on every seed is asserted here; the README lists it as experimental."""
    predictor = RSSMPredictor(train_every=1, decay=0.5, ensemble=2, window=8)
    error = _late_error(predictor, steps=200)
    assert predictor.train_steps > 50
    assert math.isfinite(error) and error < 2.0


@pytest.mark.parametrize("name", ["mlp", "rssm"])
def test_learned_state_round_trips_exactly(name):
    kwargs = {"train_every": 2, "batch_size": 4} | ({"window": 4} if name == "rssm" else {})
    predictor = build_predictor(name, **kwargs)
    params = [[torch.zeros(6, 4), torch.zeros(4)], [torch.zeros(5)]]
    predictor.setup(params, DIM)
    stream = list(_stream(40))
    for t, loss, deltas, f in stream[:30]:
        predictor.observe(t, loss, deltas, f)
    state = predictor.state_dict()
    clone = build_predictor(name, **kwargs)
    clone.load_state_dict(state)  # before setup: applied by setup
    clone.setup(params, DIM)
    for t, loss, deltas, f in stream[30:]:
        a = predictor.observe(t, loss, [[d.clone() for d in g] for g in deltas], f)
        b = clone.observe(t, loss, [[d.clone() for d in g] for g in deltas], f)
        assert a == b
    assert predictor.plan(5, stream[-1][3]) == clone.plan(5, stream[-1][3])
    assert predictor.confidence() == clone.confidence()


def test_rssm_ensemble_disagreement_lowers_confidence():
    predictor = RSSMPredictor(ensemble=3, train_every=2, batch_size=4, window=4)
    predictor.setup([[torch.zeros(6, 4), torch.zeros(4)], [torch.zeros(5)]], DIM)
    for t, loss, deltas, f in _stream(30):
        predictor.observe(t, loss, deltas, f)
    plan = predictor.plan(6, torch.zeros(DIM))
    assert predictor.uncertainty() > 0
    assert 0.0 <= predictor.confidence() < predictor._conf
    assert plan.horizon == 6 and len(plan.loss) == 7 and plan.is_finite()
    assert all(0.0 <= s <= predictor.max_scale for row in plan.scales for s in row)


def test_learned_predictors_validate_their_settings():
    with pytest.raises(ValueError, match="`hidden` must be an integer >= 1, got 0"):
        MLPPredictor(hidden=0)
    with pytest.raises(ValueError, match="`ensemble`"):
        RSSMPredictor(ensemble=0)
    with pytest.raises(ValueError, match="`window` must be <= buffer_size"):
        RSSMPredictor(window=64, buffer_size=32)
