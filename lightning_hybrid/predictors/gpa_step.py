"""The ``gpa`` step in fused eager operations: the reference that the kernels of
:mod:`~lightning_hybrid.predictors.gpa_fused` are checked against, and the path wherever they do not serve."""

from __future__ import annotations

import torch
from torch import Tensor


def average(params: list[Tensor], z: list[Tensor], x: list[Tensor], kept: Tensor, mu_x: float, mu_y: float) -> None:
    """The optimizer has stepped ``params`` from ``y``: fold its update into ``z`` and ``x``, and leave the next
    ``y`` in ``params``; nothing changes where ``kept`` is 0. The update is recovered as ``params - y`` without a copy
    of ``y``: ``params`` itself holds it on the way. 8 operations, 19 parameter copies of memory traffic."""
    with torch.no_grad():
        torch._foreach_add_(params, z, alpha=mu_y - 1.0)
        torch._foreach_add_(params, x, alpha=-mu_y)  # params := the update, as params - mu_y x - (1 - mu_y) z
        torch._foreach_mul_(params, kept)
        torch._foreach_add_(z, params)
        # a list of 0-dim weights, read on the device: one weight tensor alone would be read to the host
        torch._foreach_lerp_(x, z, [kept * (1.0 - mu_x)] * len(x))
        training_point(params, z, x, mu_y)


def training_point(params: list[Tensor], z: list[Tensor], x: list[Tensor], mu_y: float) -> None:
    """``params := y = mu_y x + (1 - mu_y) z``: where training goes on."""
    with torch.no_grad():
        torch._foreach_copy_(params, z)
        torch._foreach_lerp_(params, x, mu_y)
