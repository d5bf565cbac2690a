"""DivergenceMonitor: hosts the divergence check, so its settings are a callback's and Lightning checkpoints it."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.algorithms import DivergenceCheck
from lightning_hybrid.callbacks.base import HostComponent


class DivergenceMonitor(HostComponent):
    """Holds the :class:`~lightning_hybrid.algorithms.DivergenceCheck` the engine asks whether a prediction went
    wrong (``divergence``).

    Args:
        **settings: the check's settings, each documented there: ``z_threshold``, ``oscillation_window``,
            ``oscillation_sigmas``, ``stats_decay``, ``grad_outlier_factor``. The delayed verdict on the default
            rule's jumps is set on the rule (``verify_window``, ``verify_sigmas``, ``verify_resolution``).
    """

    def __init__(self, **settings: Any) -> None:
        self.divergence = DivergenceCheck(**settings)

    @property
    def hosted(self) -> DivergenceCheck:
        return self.divergence
