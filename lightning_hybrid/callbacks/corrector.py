"""ResidualCorrector: hosts the residual correction, so its settings are a callback's and Lightning checkpoints
it."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.algorithms import ResidualCorrection
from lightning_hybrid.callbacks.base import HostComponent


class ResidualCorrector(HostComponent):
    """Holds the :class:`~lightning_hybrid.algorithms.ResidualCorrection` that corrects per-step plans from the
    residuals of earlier segments (``correction``).

    Args:
        **settings: the correction's settings, each documented there: ``max_correction_factor``,
            ``max_residuals``, ``neighbours``, ``bandwidth``, ``time_decay``, ``correction_interval``.
    """

    def __init__(self, **settings: Any) -> None:
        self.correction = ResidualCorrection(**settings)

    @property
    def hosted(self) -> ResidualCorrection:
        return self.correction
