"""ResidualCorrector: hosts the residual correction, so its settings are a callback's and Lightning checkpoints
it."""

from __future__ import annotations

from typing_extensions import Unpack

from lightning_hybrid.algorithms import ResidualCorrection
from lightning_hybrid.callbacks.base import HostComponent
from lightning_hybrid.settings import settings_dict

CorrectorSettings = settings_dict("CorrectorSettings", ResidualCorrection)


class ResidualCorrector(HostComponent):
    """Holds the :class:`~lightning_hybrid.algorithms.ResidualCorrection` that corrects per-step plans from the
    residuals of earlier segments (``correction``).

    Its settings are the correction's (``ResidualCorrection``'s fields; ``docs/settings.md``).
    """

    def __init__(self, **settings: Unpack[CorrectorSettings]) -> None:
        self.correction = ResidualCorrection(**settings)

    @property
    def hosted(self) -> ResidualCorrection:
        return self.correction
