"""The engine's :class:`~lightning_hybrid.engine.Collectives` from the Trainer's strategy, whichever it is:
Lightning's ``reduce`` over the ranks, and where FSDP2 holds the parameters as ``DTensor`` shards, each rank's local
shard, sums over the ranks, and the gathered copies FSDP2 keeps dropped after the engine changed the shards."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


class TrainerCollectives:
    """What the engine needs of the run's ranks, from ``strategy`` (read, never changed) and the ``module`` it
    trains. ``sharded``: each rank holds only shards of the parameters (FSDP2)."""

    def __init__(self, strategy: Any, module: torch.nn.Module, sharded: bool) -> None:
        self.strategy, self.module, self.sharded = strategy, module, sharded
        self.root_device: torch.device = strategy.root_device

    def local_tensor(self, tensor: Tensor) -> Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    def sum_across_ranks(self, tensor: Tensor) -> Tensor:
        return self.strategy.reduce(tensor.clone(), reduce_op="sum") if self.sharded else tensor

    def reduce(self, tensor: Tensor, group: Any = None, reduce_op: str | None = "mean") -> Tensor:
        return self.strategy.reduce(tensor, group, reduce_op)

    def parameters_changed(self) -> None:
        """After a forward without backward (a Predict step's check) FSDP2 keeps the root's gathered parameters,
        and the next forward would run on them, not on the shards the engine changed: drop them."""
        if self.sharded:
            for module in self.module.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
