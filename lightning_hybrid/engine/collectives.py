"""The engine's :class:`~.interface.Collectives` in plain torch: one process, or the ranks of ``torch.distributed``
(a Fabric loop's, a ``torchrun`` loop's), and where FSDP2 holds the parameters as ``DTensor`` shards, each rank's
local shard, sums over the ranks, and the gathered copies FSDP2 keeps dropped after the engine changed the shards.
The scheduler's (``callbacks/ranks.py``) reduces through the Trainer's strategy instead."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


class TorchCollectives:
    """What the engine needs of the run's ranks, for the parameters of ``modules`` (none: one process's tensors on
    ``device``). ``sharded``: each rank holds only shards of the parameters (FSDP2)."""

    def __init__(self, *modules: torch.nn.Module, device: torch.device | str | None = None) -> None:
        self.modules = modules
        params = [p for module in modules for p in module.parameters()]
        self.sharded = any(isinstance(p, DTensor) for p in params)
        first = self.local_tensor(params[0]).device if params else torch.device("cpu")
        self.root_device = torch.device(device) if device is not None else first

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if _distributed() else 1

    @property
    def rank(self) -> int:
        return dist.get_rank() if _distributed() else 0

    def local_tensor(self, tensor: Tensor) -> Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    def sum_across_ranks(self, tensor: Tensor) -> Tensor:
        return self.reduce(tensor.clone(), reduce_op="sum") if self.sharded else tensor

    def reduce(self, tensor: Tensor, group: Any = None, reduce_op: str | None = "mean") -> Tensor:
        """A sum or mean over the ranks, as Lightning's strategies take it (a sum, divided for the mean)."""
        if self.world_size == 1:
            return tensor
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor / dist.get_world_size(group) if reduce_op in ("mean", "avg") else tensor

    def parameters_changed(self) -> None:
        """After a forward without backward (a Predict step's check) FSDP2 keeps the root's gathered parameters,
        and the next forward would run on them, not on the shards the engine changed: drop them."""
        if self.sharded:
            for module in _modules(self.modules):
                if isinstance(module, FSDPModule):
                    module.reshard()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _modules(roots: Iterable[torch.nn.Module]) -> Iterable[torch.nn.Module]:
    return (module for root in roots for module in root.modules())
