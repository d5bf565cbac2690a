"""The engine's algorithm parts in plain torch, without Lightning (as ``torch.optim.swa_utils`` is under Lightning's
SWA callback): the divergence check, the residual correction and the horizon bandit. The hybrid callbacks
(``DivergenceMonitor``, ``ResidualCorrector``, ``HorizonBandit``) hold, configure and checkpoint them."""

from lightning_hybrid.algorithms.divergence import REASONS, DivergenceCheck
from lightning_hybrid.algorithms.horizons import LinUCBHorizons
from lightning_hybrid.algorithms.residuals import ResidualCorrection

__all__ = ["REASONS", "DivergenceCheck", "LinUCBHorizons", "ResidualCorrection"]
