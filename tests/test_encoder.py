"""StateEncoder: fixed size, finite and bounded for any finite input, and checkpointable."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hybrid.encoder import StateEncoder, symlog

finite = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0.0, -0.0, 1e-300, 1e30, -1e30, 1.7e308]),
)
observation = st.fixed_dictionaries(
    {
        "loss": finite,
        "grad_norm": finite,
        "lrs": st.lists(finite, min_size=1, max_size=30),
        "update_sq": st.one_of(st.none(), st.lists(finite, min_size=1, max_size=30)),
        "prediction_error": st.one_of(st.none(), finite),
        "loss_residual": st.one_of(st.none(), finite),
    }
)


@settings(max_examples=150, deadline=None)
@given(st.lists(observation, min_size=1, max_size=25), st.sampled_from([14, 32, 64]))
def test_features_are_finite_bounded_and_fixed_size(observations, dim):
    encoder = StateEncoder(dim=dim, clip=5.0)
    for step, obs in enumerate(observations):
        encoder.observe(step, **obs)
        features = encoder.features()
        assert features.shape == (dim,)
        assert torch.isfinite(features).all()
        assert features.abs().max() <= 5.0


def test_non_finite_inputs_encode_as_zero_without_poisoning_the_statistics():
    encoder = StateEncoder(dim=32)
    for step in range(20):
        encoder.observe(step, loss=2.0 - 0.01 * step, grad_norm=1.0, lrs=[1e-3], update_sq=[1e-4])
    encoder.observe(20, loss=math.nan, grad_norm=math.inf, lrs=[1e-3], update_sq=[math.nan])
    assert torch.isfinite(encoder.features()).all()
    encoder.observe(21, loss=1.8, grad_norm=1.0, lrs=[1e-3], update_sq=[1e-4])
    assert torch.isfinite(encoder.features()).all()
    assert all(math.isfinite(v) for v in encoder.state_dict()["mean"])


def test_features_respond_to_the_state():
    """A loss that starts rising moves the slope feature up, relative to a steady decrease."""
    encoder = StateEncoder(dim=32, window=8)
    for step in range(40):
        encoder.observe(step, loss=3.0 - 0.02 * step, grad_norm=1.0, lrs=[1e-3], update_sq=[1e-4])
    falling = encoder.features()[1].item()
    for step in range(40, 48):
        encoder.observe(step, loss=2.2 + 0.1 * (step - 40), grad_norm=1.0, lrs=[1e-3], update_sq=[1e-4])
    assert encoder.features()[1].item() > falling + 1.0


def test_many_groups_fold_into_the_last_slot():
    encoder = StateEncoder(dim=20)  # 11 global features leave 3 group slots
    assert encoder.max_groups == 3
    encoder.observe(0, loss=1.0, grad_norm=1.0, lrs=[1e-3] * 10, update_sq=[1.0] * 10)
    assert encoder.features().shape == (20,)


def test_state_round_trips():
    encoder = StateEncoder(dim=32)
    for step in range(15):
        encoder.observe(
            step, loss=1.0 / (step + 1), grad_norm=0.5, lrs=[1e-3, 1e-4], update_sq=[1e-4, 1e-6], prediction_error=0.3
        )
    clone = StateEncoder(dim=32)
    clone.load_state_dict(encoder.state_dict())
    assert torch.equal(clone.features(), encoder.features())


def test_symlog():
    assert symlog(0.0) == 0.0 and symlog(-1e30) == -symlog(1e30) and symlog(1e30) < 70
