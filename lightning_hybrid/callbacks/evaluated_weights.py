"""What a checkpoint holds of the weights where the run is evaluated at other weights than it trains (an averaging
rule: the average): written into the checkpoint's ``state_dict`` from ``on_save_checkpoint``, as Lightning's
``WeightAveraging`` writes its average, so the parameters themselves never change for a checkpoint."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor


def write_weights(state_dict: dict[str, Any], module: torch.nn.Module, owners: list[Tensor], weights: list[Tensor]):
    """Put ``weights`` (this rank's, one per parameter in ``owners``) in ``state_dict`` wherever it holds one of those
    parameters, under each name the module gives it; a sharded entry (a ``DTensor``) gets a ``DTensor`` of the same
    layout. A parameter the state dict leaves out is not written."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    for owner, weight in zip(owners, weights):
        for name in names.get(id(owner), ()):
            entry = state_dict.get(name)
            if entry is None:
                continue
            if isinstance(entry, DTensor):
                local = weight.detach().to(entry.to_local().device)
                state_dict[name] = DTensor.from_local(
                    local, entry.device_mesh, entry.placements, shape=entry.shape, stride=entry.stride()
                )
            else:
                state_dict[name] = weight.detach().to(entry.device)
