"""The ``linear`` predictor on synthetic update streams with known dynamics."""

import math

import pytest
import torch

from lightning_hybrid.predictors import LinearPredictor, build_predictor


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(4, 3, generator=g), torch.randn(3, generator=g)], [torch.randn(5, generator=g)]]


def _feed(predictor, deltas_fn, steps, loss_fn=lambda t: 1.0):
    stats = None
    for t in range(steps):
        stats = predictor.observe(t, loss_fn(t), deltas_fn(t))
    return stats


def test_constant_updates_are_predicted_with_full_confidence():
    params = _params()
    const = [[torch.full_like(p, 0.01 * (g + 1)) for p in group] for g, group in enumerate(params)]
    predictor = LinearPredictor(decay=0.8, scale_decay=0.8)
    predictor.setup(params, 16)
    stats = _feed(predictor, lambda t: [[c.clone() for c in group] for group in const], 80)
    assert predictor.ready
    assert predictor.confidence() > 0.99
    assert stats.relative_error < 0.01
    plan = predictor.plan(5)
    for g, (group, dirs) in enumerate(zip(const, predictor.directions())):
        for c, d in zip(group, dirs):
            assert torch.allclose(plan.scales[0][g] * d, c, rtol=1e-3)


def test_noise_gets_low_confidence_and_a_small_scale():
    params = _params()
    g = torch.Generator().manual_seed(3)
    predictor = LinearPredictor()
    predictor.setup(params, 16)
    _feed(predictor, lambda t: [[0.01 * torch.randn(p.shape, generator=g) for p in group] for group in params], 200)
    assert predictor.confidence() < 0.2
    assert all(s < 0.3 for s in predictor.scales())


def test_prediction_beats_a_zero_update_baseline_on_drifting_updates():
    """Updates = slow drift + noise: the predictor explains the drift, so its error is below 1 (the zero guess)."""
    params = _params()
    g = torch.Generator().manual_seed(4)
    drift = [[torch.randn(p.shape, generator=g) for p in group] for group in params]
    predictor = LinearPredictor()
    predictor.setup(params, 16)
    errors = []
    for t in range(150):
        deltas = [[0.01 * d + 0.004 * torch.randn(d.shape, generator=g) for d in group] for group in drift]
        stats = predictor.observe(t, 1.0, deltas)
        errors.append(stats.relative_error)
    assert sum(errors[-50:]) / 50 < 0.6
    assert 0.5 < predictor.confidence() < 1.0


def test_loss_trend_is_extrapolated_with_an_upper_bound():
    params = _params()
    predictor = LinearPredictor(loss_window=16, bound_sigmas=3.0)
    predictor.setup(params, 16)
    _feed(predictor, lambda t: [[torch.zeros_like(p) for p in group] for group in params], 20, lambda t: 5.0 - 0.1 * t)
    plan = predictor.plan(3)
    assert plan.horizon == 3 and len(plan.loss) == 4
    assert plan.loss == pytest.approx([5.0 - 0.1 * (19 + h) for h in (1, 2, 3, 4)], abs=1e-9)
    # noise-free trend: the bound is the prediction plus bound_sigmas * |slope| * h
    assert plan.loss_upper == pytest.approx([m + 3.0 * 0.1 * h for m, h in zip(plan.loss, (1, 2, 3, 4))])
    assert plan.is_finite()


def test_observing_overwrites_nothing_but_the_scratch_and_keeps_buffers_in_place():
    params = _params()
    predictor = LinearPredictor()
    predictor.setup(params, 16)
    ptrs = [t.data_ptr() for group in predictor.directions() for t in group]
    _feed(predictor, lambda t: [[torch.ones_like(p) for p in group] for group in params], 5)
    assert [t.data_ptr() for group in predictor.directions() for t in group] == ptrs


def test_state_round_trips_before_and_after_setup():
    params = _params()
    predictor = LinearPredictor()
    predictor.setup(params, 16)
    g = torch.Generator().manual_seed(5)
    _feed(predictor, lambda t: [[torch.randn(p.shape, generator=g) for p in group] for group in params], 30, math.sqrt)
    state = predictor.state_dict()
    for load_first in (True, False):
        clone = LinearPredictor()
        if load_first:
            clone.load_state_dict(state)
            clone.setup(_params(1), 16)
        else:
            clone.setup(_params(1), 16)
            clone.load_state_dict(state)
        assert clone.confidence() == predictor.confidence()
        assert clone.scales() == predictor.scales()
        assert clone.plan(4) == predictor.plan(4)
        for a, b in zip(clone.directions(), predictor.directions()):
            assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_state_with_other_shapes_is_refused():
    predictor = LinearPredictor()
    predictor.setup(_params(), 16)
    other = LinearPredictor()
    other.setup([[torch.zeros(2)]], 16)
    with pytest.raises(ValueError, match="shapes"):
        predictor.load_state_dict(other.state_dict())


def test_build_by_name():
    assert isinstance(build_predictor("linear", decay=0.5), LinearPredictor)


def test_update_statistics_match_a_direct_computation_across_a_reload():
    """``||delta||^2``, ``||m||^2`` and ``<delta, m>`` come from three passes (the last norm kept for the next step);
    they match the statistics computed from the tensors themselves, also right after a ``load_state_dict``."""
    params = _params()
    g = torch.Generator().manual_seed(5)
    predictor = LinearPredictor(decay=0.7)
    predictor.setup(params, 16)
    reference = [[torch.zeros_like(p) for p in group] for group in params]
    for t in range(12):
        if t == 6:  # a resumed run: the predictor restarts from its state
            state = predictor.state_dict()
            predictor = LinearPredictor(decay=0.7)
            predictor.load_state_dict(state)
            predictor.setup(params, 16)
        deltas = [[0.1 + torch.randn(p.shape, generator=g, dtype=p.dtype) for p in group] for group in params]
        flat = [torch.cat([d.flatten() for d in group]).double() for group in deltas]
        avg = [torch.cat([m.flatten() for m in group]).double() for group in reference]
        tracked = predictor.track([[d.clone() for d in group] for group in deltas]).tolist()
        actual, avg_sq, dots = predictor._statistics(tracked)
        assert actual == pytest.approx([float(f @ f) for f in flat], rel=1e-5)
        assert avg_sq == pytest.approx([float(m @ m) for m in avg], rel=1e-5, abs=1e-9)
        assert dots == pytest.approx([float(f @ m) for f, m in zip(flat, avg)], rel=1e-4, abs=1e-5)
        for group, ref in zip(deltas, reference):
            for d, m in zip(group, ref):
                m.mul_(0.7).add_(d, alpha=0.3)
    for group, ref in zip(predictor.directions(), reference):
        for m, r in zip(group, ref):
            torch.testing.assert_close(m, r)
