"""The ``gpa`` step in one Triton kernel, where the device has it: each element of the parameters, ``z`` and ``x``
read once and written once, the floor of 6 parameter copies of memory traffic, against the eager path's 19
(:mod:`~lightning_hybrid.predictors.gpa_step`, which stays the reference and the fallback). The same formula and
the same float32 operations per element, with torch's ``lerp``; the training point alone (after an evaluation at
the average) comes from a second kernel with the same arithmetic, so that ``y`` is always computed one way.

Used for float32, contiguous, plain tensors on CUDA (:func:`~.fused_blocks.served`), once the kernels have been
checked against the eager path on the device (once a process); everywhere else the eager path runs."""

from __future__ import annotations

import torch
from torch import Tensor

import lightning_hybrid.predictors.gpa_step as gpa_step
from lightning_hybrid.predictors.fused_blocks import BLOCK, blocks_for, checked, checking_lists, close, served, triton

if triton is not None:
    import triton.language as tl

    from lightning_hybrid.predictors.fused_blocks import address, block_of

    @triton.jit
    def _lerp(start, end, weight):
        """torch's ``lerp``, which takes the nearer end for its base."""
        return tl.where(tl.abs(weight) < 0.5, start + weight * (end - start), end - (end - start) * (1.0 - weight))

    @triton.jit
    def _average_kernel(tables, of_block, start_of_block, numels, kept, to_z, to_x, rest_x, mu_y, n_tensors,
                        B: tl.constexpr):  # fmt: skip
        _, t, offs, mask = block_of(of_block, start_of_block, numels, B)
        at_p = address(tables, 0, t, n_tensors)
        at_z = address(tables, 1, t, n_tensors)
        at_x = address(tables, 2, t, n_tensors)
        p = tl.load(at_p + offs, mask=mask, other=0.0)
        z = tl.load(at_z + offs, mask=mask, other=0.0)
        x = tl.load(at_x + offs, mask=mask, other=0.0)
        k = tl.load(kept)
        z = z + ((p + to_z * z) + to_x * x) * k  # the update, params - mu_y x - (1 - mu_y) z, kept or not
        x = _lerp(x, z, k * rest_x)
        tl.store(at_z + offs, z, mask=mask)
        tl.store(at_x + offs, x, mask=mask)
        tl.store(at_p + offs, _lerp(z, x, mu_y), mask=mask)

    @triton.jit
    def _training_point_kernel(tables, of_block, start_of_block, numels, mu_y, n_tensors, B: tl.constexpr):
        _, t, offs, mask = block_of(of_block, start_of_block, numels, B)
        z = tl.load(address(tables, 1, t, n_tensors) + offs, mask=mask, other=0.0)
        x = tl.load(address(tables, 2, t, n_tensors) + offs, mask=mask, other=0.0)
        tl.store(address(tables, 0, t, n_tensors) + offs, _lerp(z, x, mu_y), mask=mask)


def usable(params: list[Tensor], z: list[Tensor], x: list[Tensor]) -> bool:
    """Whether the kernels serve these lists: where they run, and after they agreed with the eager path there."""
    if not served([params, z, x]):
        return False
    device = params[0].device
    return checked("gpa step", device, (), lambda: _agrees(device))


def average(params: list[Tensor], z: list[Tensor], x: list[Tensor], kept: Tensor, mu_x: float, mu_y: float) -> None:
    """:func:`~.gpa_step.average`, in one pass; ``kept`` a float32 0-dim tensor on the device."""
    k = blocks_for(params, 3)
    k.point_at([params, z, x])
    _average_kernel[k.grid](k.tables, k.of_block, k.start_of_block, k.numels, kept, mu_y - 1.0, -mu_y, 1.0 - mu_x,
                            mu_y, len(params), B=BLOCK)  # fmt: skip


def training_point(params: list[Tensor], z: list[Tensor], x: list[Tensor], mu_y: float) -> None:
    """:func:`~.gpa_step.training_point`, with the arithmetic :func:`average` leaves ``y`` by."""
    k = blocks_for(params, 3)
    k.point_at([params, z, x])
    _training_point_kernel[k.grid](k.tables, k.of_block, k.start_of_block, k.numels, mu_y, len(params), B=BLOCK)


def _agrees(device: torch.device) -> bool:
    """Whether the kernels make the eager step on ``device`` within float32 rounding, on tensors of sizes across a
    block's edge and norms 12 orders of magnitude apart; a step not kept changes nothing, bitwise, and the training
    point alone is the step's, bitwise."""
    mu_x, mu_y = 0.9, 0.7
    params, z, x = checking_lists(device, 3)
    eager = [[t.clone() for t in ts] for ts in (params, z, x)]
    one = torch.ones((), device=device)
    gpa_step.average(*eager, one, mu_x, mu_y)
    average(params, z, x, one, mu_x, mu_y)
    made = [close(a, b) for a, b in zip([*params, *z, *x], [t for ts in eager for t in ts])]
    stepped = [[t.clone() for t in ts] for ts in (params, z, x)]
    average(params, z, x, torch.zeros((), device=device), mu_x, mu_y)
    training_point(params, z, x, mu_y)
    unchanged = all(torch.equal(a, b) for a, b in zip([*params, *z, *x], [t for ts in stepped for t in ts]))
    return all(made) and unchanged
