"""DivergenceMonitor: hosts the divergence check, so its settings are a callback's and Lightning checkpoints it."""

from __future__ import annotations

from typing_extensions import Unpack

from lightning_hybrid.algorithms import DivergenceCheck
from lightning_hybrid.callbacks.base import HostComponent
from lightning_hybrid.settings import settings_dict

MonitorSettings = settings_dict("MonitorSettings", DivergenceCheck)


class DivergenceMonitor(HostComponent):
    """Holds the :class:`~lightning_hybrid.algorithms.DivergenceCheck` the engine asks whether a prediction went
    wrong (``divergence``).

    Its settings are the check's (``DivergenceCheck``'s fields; ``docs/settings.md``).
    """

    def __init__(self, **settings: Unpack[MonitorSettings]) -> None:
        self.divergence = DivergenceCheck(**settings)

    @property
    def hosted(self) -> DivergenceCheck:
        return self.divergence
