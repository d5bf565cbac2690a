"""The scalar statistics on their own: the moving mean and variance, the loss trend, and the fused norm."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.stats import EmaStats, LossTrend, sq_norm


def test_the_moving_statistics_follow_their_recurrence_and_round_trip():
    stats, decay = EmaStats(0.9), 0.9
    values = [1.0, 3.0, 2.0, 5.0, 4.0]
    mean, var = values[0], 0.0
    for x in values[1:]:
        delta = x - mean
        mean += (1 - decay) * delta
        var = decay * (var + (1 - decay) * delta * delta)
    for x in values:
        stats.update(x)
    assert stats.count == 5 and stats.mean == pytest.approx(mean) and stats.std == pytest.approx(var**0.5)
    again = EmaStats(0.9)
    again.load_state_dict(stats.state_dict())
    assert again.state_dict() == stats.state_dict()


def test_the_first_value_sets_the_mean_with_no_spread():
    stats = EmaStats(0.5)
    stats.update(3.0)
    assert (stats.mean, stats.std) == (3.0, 0.0)


def test_the_trend_of_a_line_is_the_line_and_forgets_beyond_its_window():
    trend = LossTrend(window=4)
    for step in range(10):
        trend.add(step, 5.0 - 0.5 * step)
    level, slope, noise = trend.fit()
    assert len(trend) == 4 and level == pytest.approx(0.5) and slope == pytest.approx(-0.5) and noise < 1e-9
    again = LossTrend(window=1)
    again.load_state_dict(trend.state_dict())
    assert again.fit() == trend.fit() and again.points.maxlen == 4


def test_an_empty_trend_says_it_knows_nothing():
    level, slope, noise = LossTrend(3).fit()
    assert slope == 0.0 and level != level and noise != noise  # nan


def test_the_fused_norm_is_the_sum_of_squares():
    tensors = [torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 2.0]])]
    assert sq_norm(tensors).item() == pytest.approx(30.0)
