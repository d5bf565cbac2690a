"""Hybrid predictive training for PyTorch Lightning: ``HybridScheduler``, one callback for a Trainer of
``lightning.pytorch`` or of the standalone ``pytorch_lightning``, and ``HybridLoop``, the same plugin in a loop of
one's own (Fabric's, plain PyTorch's). What needs Lightning is imported when first used, so a loop that uses
``HybridLoop`` alone imports no Lightning; the per-step mode's strategies are ``lightning.pytorch``'s, known by name
once the callbacks are imported."""

from __future__ import annotations

import importlib
from typing import Any

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.loop import HybridLoop
from lightning_hybrid.outputs import PREDICTED_STEP_KEY, is_predicted_step
from lightning_hybrid.phase import Phase

__version__ = "0.1.0"

# what needs Lightning, by the module that holds it
_WITH_LIGHTNING = {
    **dict.fromkeys(
        (
            "DivergenceMonitor",
            "DynamicsPredictor",
            "HorizonBandit",
            "HybridProgressBar",
            "HybridScheduler",
            "ResidualCorrector",
            "VRAMLogger",
            "hybrid_callbacks",
            "is_unverified_checkpoint",
        ),
        "lightning_hybrid.callbacks",
    ),
    "RunMeter": "lightning_hybrid.meter",
    "FullyShardedStrategy": "lightning_hybrid.fsdp",
    "HybridFSDPStrategy": "lightning_hybrid.fsdp",
    "HybridDDPStrategy": "lightning_hybrid.strategy",
    "HybridPredictStrategy": "lightning_hybrid.strategy",
}


def __getattr__(name: str) -> Any:
    if name not in _WITH_LIGHTNING:
        raise AttributeError(f"module 'lightning_hybrid' has no attribute {name!r}")
    importlib.import_module("lightning_hybrid.callbacks")  # the strategies known by name
    value = getattr(importlib.import_module(_WITH_LIGHTNING[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WITH_LIGHTNING})


__all__ = [
    "PREDICTED_STEP_KEY",
    "DivergenceMonitor",
    "DynamicsPredictor",
    "FullyShardedStrategy",
    "HorizonBandit",
    "HybridConfig",
    "HybridDDPStrategy",
    "HybridFSDPStrategy",
    "HybridLoop",
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
