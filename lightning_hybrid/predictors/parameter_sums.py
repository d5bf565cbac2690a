"""Sums over a model's parameter tensors that the outer rule reads at a cycle's end, each a handful of fused
kernels whatever the number of tensors, and whether its state fits beside them on their device."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_hybrid.predictors.rules import TensorList


def cosine_terms(xs: list[Tensor], ys: TensorList) -> Tensor:
    """``[x · y, |x|², |y|²]`` summed over the pairs of ``xs`` and ``ys``, in float64, in a handful of fused kernels
    whatever the number of tensors: ``x · y = (|x + y|² - |x - y|²) / 4``. ``xs`` is a temporary, overwritten."""
    if not xs:
        return torch.zeros(3, dtype=torch.float64)

    def total(tensors: TensorList) -> Tensor:
        return squares(tensors, torch.float64).sum()

    with torch.no_grad():
        x_sq, y_sq = total(xs), total(ys)
        torch._foreach_add_(xs, ys)
        plus = total(xs)
        torch._foreach_add_(xs, ys, alpha=-2.0)
        return torch.stack(((plus - total(xs)) / 4, x_sq, y_sq))


def state_fits(params: TensorList, copies: int) -> bool:
    """Whether ``copies`` of the parameters take at most half the free memory of their device (always, off CUDA:
    there the host is the device)."""
    if not params[0].is_cuda:
        return True
    free, _ = torch.cuda.mem_get_info(params[0].device)
    return copies * sum(p.numel() * p.element_size() for p in params) <= free / 2


def squares(tensors: TensorList, dtype: torch.dtype = torch.float32) -> Tensor:
    """Each tensor's squared norm, in ``dtype`` (one fused norm; empty where there are no tensors)."""
    if not tensors:
        return torch.zeros(0, dtype=dtype)
    return torch.stack(torch._foreach_norm(tensors, dtype=dtype)).square()
