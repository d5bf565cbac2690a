"""The engine's :class:`~lightning_hybrid.engine.Collectives` from the Trainer's strategy, whichever it is: torch's
(:class:`~lightning_hybrid.engine.collectives.TorchCollectives`), reduced over the ranks by Lightning's ``reduce``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.engine.collectives import TorchCollectives


class TrainerCollectives(TorchCollectives):
    """What the engine needs of the run's ranks, from ``strategy`` (read, never changed) and the ``module`` it
    trains. ``sharded``: each rank holds only shards of the parameters (FSDP2)."""

    def __init__(self, strategy: Any, module: torch.nn.Module, sharded: bool) -> None:
        super().__init__(module, device=strategy.root_device)
        self.strategy, self.sharded = strategy, sharded

    def reduce(self, tensor: Tensor, group: Any = None, reduce_op: str | None = "mean") -> Tensor:
        return self.strategy.reduce(tensor, group, reduce_op)
