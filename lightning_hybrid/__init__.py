"""Hybrid predictive training for PyTorch Lightning: ``HybridScheduler``, one callback for a Trainer of
``lightning.pytorch`` or of the standalone ``pytorch_lightning``. The per-step mode's strategies are
``lightning.pytorch``'s, here where it is installed."""

from lightning_hybrid.callbacks import (
    DivergenceMonitor,
    DynamicsPredictor,
    HorizonBandit,
    HybridProgressBar,
    HybridScheduler,
    ResidualCorrector,
    VRAMLogger,
    hybrid_callbacks,
    is_unverified_checkpoint,
)
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.lightning_packages import HAS_LIGHTNING
from lightning_hybrid.meter import RunMeter
from lightning_hybrid.outputs import PREDICTED_STEP_KEY, is_predicted_step
from lightning_hybrid.phase import Phase

if HAS_LIGHTNING:
    from lightning_hybrid.fsdp import FullyShardedStrategy, HybridFSDPStrategy
    from lightning_hybrid.registry import register_strategies
    from lightning_hybrid.strategy import HybridDDPStrategy, HybridPredictStrategy

    register_strategies()

__version__ = "0.1.0"

__all__ = [
    "PREDICTED_STEP_KEY",
    "DivergenceMonitor",
    "DynamicsPredictor",
    "FullyShardedStrategy",
    "HorizonBandit",
    "HybridConfig",
    "HybridDDPStrategy",
    "HybridFSDPStrategy",
    "HybridPredictStrategy",
    "HybridProgressBar",
    "HybridScheduler",
    "Phase",
    "ResidualCorrector",
    "RunMeter",
    "VRAMLogger",
    "hybrid_callbacks",
    "is_predicted_step",
    "is_unverified_checkpoint",
]
