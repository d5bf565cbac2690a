"""Property tests: on random (finite, possibly extreme) inputs the predictors, corrector and bandit give finite,
bounded outputs, and their state round-trips through ``state_dict``. (The state encoder's properties are in
``tests/test_encoder.py``.)"""

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_hybrid.algorithms import LinUCBHorizons, ResidualCorrection
from lightning_hybrid.predictors import Plan, UpdateStats, build_predictor

FEATURES = 16
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
scale = st.floats(1e-8, 1e3)
PREDICTOR_KWARGS = {
    "linear": {"min_observations": 3},
    "mlp": {"min_observations": 3, "train_every": 2, "batch_size": 2},
    "rssm": {"min_observations": 3, "train_every": 2, "batch_size": 2, "window": 4},
}
slow = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
untimed = settings(deadline=None)  # no example is failed for its time: a loaded machine, or a first call, is slower


def _params():
    torch.manual_seed(0)
    return [[torch.randn(3, 4), torch.randn(4)], [torch.randn(5)]]


def _feed(predictor, losses, sizes, seed):
    params = _params()
    predictor.setup(params, FEATURES)
    g = torch.Generator().manual_seed(seed)
    for step, (loss, size) in enumerate(zip(losses, sizes)):
        deltas = [[torch.randn(p.shape, generator=g) * size for p in group] for group in params]
        predictor.observe(step, loss, deltas, torch.randn(FEATURES, generator=g).clamp(-5, 5))
    return params


@slow
@given(
    st.sampled_from(sorted(PREDICTOR_KWARGS)),
    st.lists(finite, min_size=6, max_size=12),
    st.lists(scale, min_size=12, max_size=12),
    st.integers(0, 2**16),
    st.integers(1, 8),
)
def test_predictor_plans_are_finite_bounded_and_survive_a_round_trip(name, losses, sizes, seed, horizon):
    predictor = build_predictor(name, **PREDICTOR_KWARGS[name])
    _feed(predictor, losses, sizes, seed)
    assert 0.0 <= predictor.confidence() <= 1.0 and math.isfinite(predictor.uncertainty())
    if not predictor.ready:
        return
    features = torch.zeros(FEATURES)
    plan = predictor.plan(horizon, features)
    assert plan.horizon == horizon and plan.is_finite()
    assert all(abs(s) <= predictor.max_scale for row in plan.scales for s in row)
    assert all(lo <= hi for lo, hi in zip(plan.loss, plan.loss_upper))
    directions = predictor.directions()
    assert all(torch.isfinite(d).all() for group in directions for d in group)
    again = build_predictor(name, **PREDICTOR_KWARGS[name])
    again.setup(_params(), FEATURES)
    again.load_state_dict(predictor.state_dict())
    assert again.plan(horizon, features).to_dict() == predictor.plan(horizon, features).to_dict()


stats = st.builds(
    UpdateStats,
    actual_sq=st.lists(st.floats(0, 1e6), min_size=2, max_size=2),
    predicted_sq=st.lists(st.floats(0, 1e6), min_size=2, max_size=2),
    dot=st.lists(finite, min_size=2, max_size=2),
    loss=finite,
    predicted_loss=finite,
)


@untimed
@given(st.lists(stats, min_size=1, max_size=20), st.lists(finite, min_size=FEATURES, max_size=FEATURES))
def test_corrector_factors_are_bounded_and_its_state_round_trips(observations, feature_values):
    corrector = ResidualCorrection(max_correction_factor=2.0, max_residuals=8)
    features = torch.tensor(feature_values).clamp(-5, 5)
    for step, s in enumerate(observations):
        corrector.observe(step, s, features * (step % 3))
    factors, offset = corrector.correction(features, len(observations), 2)
    assert all(0.5 - 1e-6 <= f <= 2.0 + 1e-6 for f in factors) and math.isfinite(offset)  # float32 weights
    plan = Plan(scales=[[1.0, 1.0]], loss=[1.0, 1.0], loss_upper=[2.0, 2.0], confidence=0.5)
    corrected, _ = corrector.correct(plan, features, len(observations))
    assert corrected.is_finite()
    again = ResidualCorrection(max_correction_factor=2.0, max_residuals=8)
    again.load_state_dict(corrector.state_dict())
    assert again.correction(features, len(observations), 2) == (factors, offset)


@untimed
@given(
    st.lists(st.tuples(st.integers(0, 5), st.floats(allow_nan=True, allow_infinity=True)), max_size=30),
    st.lists(finite, min_size=FEATURES, max_size=FEATURES),
)
def test_bandit_scores_stay_finite_on_any_rewards_and_its_state_round_trips(plays, feature_values):
    bandit = LinUCBHorizons()
    bandit.setup_arms(32, FEATURES)
    features = torch.tensor(feature_values).clamp(-5, 5)
    for arm, reward in plays:
        bandit.update(arm, features, reward)  # non-finite rewards count as the worst clipped reward
    scores = bandit.scores(features)
    assert all(math.isfinite(s) for s in scores) and scores[0] == 0.0
    assert 0 <= bandit.choose(features) < len(bandit.horizons)
    again = LinUCBHorizons()
    again.setup_arms(32, FEATURES)
    again.load_state_dict(bandit.state_dict())
    assert again.scores(features) == scores
