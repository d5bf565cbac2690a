"""HorizonBandit: hosts the horizon bandit, so its settings are a callback's and Lightning checkpoints it."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.algorithms import LinUCBHorizons
from lightning_hybrid.callbacks.base import HostComponent


class HorizonBandit(HostComponent):
    """Holds the :class:`~lightning_hybrid.algorithms.LinUCBHorizons` that chooses each Predict segment's horizon,
    including "don't predict" (``horizons``). It runs only where listed among the callbacks.

    Args:
        **settings: the bandit's settings, each documented there: ``arms``, ``alpha``, ``ridge``,
            ``rollback_penalty``, ``reward_clip``, ``cost``, ``predict_cost``, ``baseline_window``,
            ``exploration_plays``.
    """

    def __init__(self, **settings: Any) -> None:
        self.horizons = LinUCBHorizons(**settings)

    @property
    def hosted(self) -> LinUCBHorizons:
        return self.horizons
