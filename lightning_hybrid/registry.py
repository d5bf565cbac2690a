"""Strategy names for ``Trainer(strategy=...)``: ``"hybrid"``, ``"hybrid_ddp"``, ``"hybrid_fsdp"`` and its plain parent
``"plain_fsdp"``, registered with Lightning's ``StrategyRegistry`` as the plugin's callbacks are imported (the
per-step mode these strategies run needs them, so any run that names one has imported them)."""

from __future__ import annotations

from lightning.pytorch.strategies import StrategyRegistry

from lightning_hybrid.fsdp import FullyShardedStrategy, HybridFSDPStrategy
from lightning_hybrid.strategy import HybridDDPStrategy, HybridPredictStrategy


def register_strategies() -> None:
    """Make the hybrid strategies available by name (idempotent)."""
    for cls, description in (
        (HybridPredictStrategy, "Hybrid predictive training on a single device"),
        (HybridDDPStrategy, "Hybrid predictive training with DDP"),
        (HybridFSDPStrategy, "Hybrid predictive training with FSDP2"),
        (FullyShardedStrategy, "FSDP2 that shards an unchanged LightningModule (the plain parent of hybrid_fsdp)"),
    ):
        if cls.strategy_name not in StrategyRegistry:
            StrategyRegistry.register(cls.strategy_name, cls, description=description)
