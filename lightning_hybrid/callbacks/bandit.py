"""HorizonBandit: hosts the horizon bandit, so its settings are a callback's and Lightning checkpoints it."""

from __future__ import annotations

from typing_extensions import Unpack

from lightning_hybrid.algorithms import LinUCBHorizons
from lightning_hybrid.callbacks.base import HostComponent
from lightning_hybrid.settings import settings_dict

BanditSettings = settings_dict("BanditSettings", LinUCBHorizons)


class HorizonBandit(HostComponent):
    """Holds the :class:`~lightning_hybrid.algorithms.LinUCBHorizons` that chooses each Predict segment's horizon,
    including "don't predict" (``horizons``). It runs only where listed among the callbacks.

    Its settings are the bandit's (``LinUCBHorizons``'s fields; ``docs/settings.md``).
    """

    def __init__(self, **settings: Unpack[BanditSettings]) -> None:
        self.horizons = LinUCBHorizons(**settings)

    @property
    def hosted(self) -> LinUCBHorizons:
        return self.horizons
