"""The ``outer`` rule's jump in two Triton kernels, where the device has them: one pass that only reads (the
weights, the anchor and the momentum) for every sum the restart, ``keep_norms`` and the jump's size need, and one
that reads them again and writes the new weights, anchor and momentum and the weights kept for an undo, in place:
10 parameter copies of memory traffic, against the eager path's 23 (:mod:`~lightning_hybrid.predictors.outer_jump`,
which stays the reference and the fallback). The same formula and the same order of float32 operations per element;
the sums are float64 and taken in a fixed order, so a jump is deterministic and within float32 rounding of the eager
one. Where the restart is checked it reads the host once, and otherwise not at all.

Used on CUDA for float32, contiguous, unsharded tensors with the state on the device, once :func:`usable` has
checked the kernels against the eager path on the device (once a process); everywhere else the eager path runs."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_hybrid.predictors.fused_blocks import (
    BLOCK,
    Blocks,
    blocks_for,
    checked,
    checking_lists,
    close,
    served,
    triton,
)
from lightning_hybrid.predictors.outer_jump import plan as eager_plan

ROWS = 64  # partial sums the reduction adds at a time
# per tensor: |s|², |b|², s·b, |d|², |w|², |w + d|² (w the weights, d the jump before keep_norms); the first pass
# sums all but |d|², which the reduction derives
SUMS = 6

if triton is not None:
    import triton.language as tl

    from lightning_hybrid.predictors.fused_blocks import address, block_of

    TINY = tl.constexpr(sys.float_info.min)  # the eager path's floor for a norm it divides by

    @triton.jit
    def _jump(tables, of_block, start_of_block, numels, mu, c1, c2, n_tensors, HAS_B: tl.constexpr,
              B: tl.constexpr):  # fmt: skip
        """A block's weights, displacement, momentum and new weights (before ``keep_norms``), as the eager path
        computes them: ``s = a - w``, ``b' = s + μ b``, ``w + c1 b' + c2 b``."""
        pid, t, offs, mask = block_of(of_block, start_of_block, numels, B)
        w = tl.load(address(tables, 0, t, n_tensors) + offs, mask=mask, other=0.0)
        s = tl.load(address(tables, 1, t, n_tensors) + offs, mask=mask, other=0.0) - w
        if HAS_B:
            b = tl.load(address(tables, 2, t, n_tensors) + offs, mask=mask, other=0.0)
            moved = s + mu * b
            after = (w + c1 * moved) + c2 * b
        else:
            b = tl.zeros_like(s)
            moved = s
            after = w + c1 * s
        return pid, t, offs, mask, w, s, b, moved, after

    @triton.jit
    def _sums_kernel(tables, of_block, start_of_block, numels, partial, mu, c1, c2, n_tensors, HAS_B: tl.constexpr,
                     B: tl.constexpr):  # fmt: skip
        pid, _, _, _, w, s, b, _, after = _jump(tables, of_block, start_of_block, numels, mu, c1, c2, n_tensors,
                                                HAS_B, B)  # fmt: skip
        s, b, w, after = s.to(tl.float64), b.to(tl.float64), w.to(tl.float64), after.to(tl.float64)
        row = partial + pid * 5
        tl.store(row, tl.sum(s * s, axis=0))
        tl.store(row + 1, tl.sum(b * b, axis=0))
        tl.store(row + 2, tl.sum(s * b, axis=0))
        tl.store(row + 3, tl.sum(w * w, axis=0))
        tl.store(row + 4, tl.sum(after * after, axis=0))

    @triton.jit
    def _reduce_kernel(partial, first_block, sums, scales, c_s, c_b, KEEP_NORMS: tl.constexpr, R: tl.constexpr):
        """Each tensor's blocks' partial sums added in order (one program a tensor, no atomics), then its jump's
        squared size, ``d = c_s s + c_b b``, and its ``keep_norms`` scale, ``|w| / |w + d|``."""
        t = tl.program_id(0)
        low, high = tl.load(first_block + t), tl.load(first_block + t + 1)
        s_sq, b_sq, dot = tl.zeros([R], tl.float64), tl.zeros([R], tl.float64), tl.zeros([R], tl.float64)
        w_sq, after_sq = tl.zeros([R], tl.float64), tl.zeros([R], tl.float64)
        for at in range(low, high, R):
            rows = at + tl.arange(0, R)
            mask, row = rows < high, partial + rows * 5
            s_sq += tl.load(row, mask=mask, other=0.0)
            b_sq += tl.load(row + 1, mask=mask, other=0.0)
            dot += tl.load(row + 2, mask=mask, other=0.0)
            w_sq += tl.load(row + 3, mask=mask, other=0.0)
            after_sq += tl.load(row + 4, mask=mask, other=0.0)
        s_sq, b_sq, dot = tl.sum(s_sq, axis=0), tl.sum(b_sq, axis=0), tl.sum(dot, axis=0)
        w_sq, after_sq = tl.sum(w_sq, axis=0), tl.sum(after_sq, axis=0)
        d_sq = c_s * c_s * s_sq + c_b * c_b * b_sq + 2.0 * c_s * c_b * dot
        row = sums + t * 6
        tl.store(row, s_sq)
        tl.store(row + 1, b_sq)
        tl.store(row + 2, dot)
        tl.store(row + 3, d_sq)
        tl.store(row + 4, w_sq)
        tl.store(row + 5, after_sq)
        if KEEP_NORMS:
            tl.store(scales + t, (tl.sqrt(w_sq) / tl.maximum(tl.sqrt(after_sq), TINY)).to(tl.float32))
        else:
            tl.store(scales + t, 1.0)

    @triton.jit
    def _write_kernel(tables, of_block, start_of_block, numels, scales, mu, c1, c2, n_tensors, HAS_B: tl.constexpr,
                      KEEP: tl.constexpr, B: tl.constexpr):  # fmt: skip
        _, t, offs, mask, w, _, _, moved, after = _jump(tables, of_block, start_of_block, numels, mu, c1, c2,
                                                        n_tensors, HAS_B, B)  # fmt: skip
        after = after * tl.load(scales + t)
        if KEEP:
            tl.store(address(tables, 3, t, n_tensors) + offs, w, mask=mask)
        tl.store(address(tables, 0, t, n_tensors) + offs, after, mask=mask)
        tl.store(address(tables, 1, t, n_tensors) + offs, after, mask=mask)
        if HAS_B:
            tl.store(address(tables, 2, t, n_tensors) + offs, moved, mask=mask)


class Launch:
    """What both passes need for one list of tensors, made once and kept (no allocation in a jump after the first):
    the blocks and the four lists' addresses (:class:`~.fused_blocks.Blocks`), the partial and per-tensor sums,
    and the scales."""

    def __init__(self, blocks: Blocks) -> None:
        self.blocks, device, n = blocks, blocks.tables.device, blocks.tables.shape[1]
        self.partial = torch.empty(blocks.grid[0], 5, dtype=torch.float64, device=device)
        self.sums = torch.empty(n, SUMS, dtype=torch.float64, device=device)
        self.scales = torch.empty(n, device=device)


_launches: dict[int, Launch] = {}  # by the id of their blocks, which are kept


def launch_for(params: list[Tensor]) -> Launch:
    """The kept :class:`Launch` for tensors of these sizes on their device (made at the first call)."""
    blocks = blocks_for(params, 4)
    return _launches.get(id(blocks)) or _launches.setdefault(id(blocks), Launch(blocks))


@dataclass
class FusedJumpPlan:
    """A fused jump computed and not yet made (:class:`~.outer_jump.JumpPlan`'s fields): ``commit`` makes it, in
    place in the run's own tensors."""

    momentum: list[Tensor]  # b, which the commit makes b' (empty when μ = 0)
    weights: list[Tensor]  # the anchor, which the commit makes the new weights
    restart: bool
    size: Tensor | tuple[float, float] | None
    launch: Launch
    arguments: tuple[float, float, float, bool]  # μ, c1, c2, whether the weights are kept

    def commit(self, params: list[Tensor], anchor: list[Tensor], before: list[Tensor]) -> None:
        """Make the jump: ``before`` must be the list the plan was made with."""
        launch, (mu, c1, c2, keep) = self.launch, self.arguments
        k = launch.blocks
        _write_kernel[k.grid](k.tables, k.of_block, k.start_of_block, k.numels, launch.scales, mu, c1, c2, len(params),
                              HAS_B=bool(self.momentum), KEEP=keep, B=BLOCK)  # fmt: skip


def usable(lists: list[list[Tensor]], sharded: bool, keep_norms: bool) -> bool:
    """Whether the fused jump serves these tensors (the weights, the anchor, ``b``, the weights kept; ``b`` or the
    last empty where there are none): unsharded, where kernels run (:func:`~.fused_blocks.served`), and kernels that
    agreed with the eager path on that device in this variant."""
    if sharded or not served(lists):
        return False
    device, variant = lists[0][0].device, (bool(lists[2]), bool(lists[3]), keep_norms)
    return checked("outer jump", device, variant, lambda: _agrees(device, *variant))


def plan(params: list[Tensor], anchor: list[Tensor], b: list[Tensor], before: list[Tensor], eta: float, mu: float, *,
         keep_norms: bool, check_restart: bool, measure: bool) -> FusedJumpPlan:  # fmt: skip
    """:func:`~.outer_jump.plan`'s jump, by the first two kernels, with ``before`` to be written by the commit (empty:
    no weights kept). The run's tensors are only read, and nothing is written until :meth:`FusedJumpPlan.commit`."""
    n, has_b = len(params), mu > 0
    c1, c2 = 1.0 - eta - eta * mu, -(1.0 - eta) * mu
    launch = launch_for(params)
    k = launch.blocks
    k.point_at([params, anchor, b if has_b else params, before or params])
    _sums_kernel[k.grid](k.tables, k.of_block, k.start_of_block, k.numels, launch.partial, mu, c1, c2, n, HAS_B=has_b,
                         B=BLOCK)  # fmt: skip
    _reduce_kernel[(n,)](launch.partial, k.first_block, launch.sums, launch.scales, c1, c1 * mu + c2,
                         KEEP_NORMS=keep_norms, R=ROWS)  # fmt: skip
    totals = launch.sums.sum(dim=0)  # |s|², |b|², s·b, |d|², |w|², |w + d|² over the tensors
    restart, size = False, None
    if check_restart:  # the one read of the host
        s_sq, b_sq, dot, d_sq, w_sq, _ = totals.tolist()
        restart = s_sq > 0 and b_sq > 0 and dot <= 0
        size = (d_sq, w_sq) if measure else None
    elif measure:
        size = totals[3:5]
    return FusedJumpPlan(b if has_b else [], anchor, restart, size, launch, (mu, c1, c2, bool(before)))


def _agrees(device: torch.device, has_b: bool, keep: bool, keep_norms: bool) -> bool:
    """Whether the kernels make the eager path's jump on ``device`` in this variant, within float32 rounding, on
    tensors of sizes across a block's edge and norms 12 orders of magnitude apart."""
    mu = 0.5 if has_b else 0.0
    params, anchor, noise = checking_lists(device, 3)
    b = [(a - w).mul_(0.5).add_(e, alpha=0.1) for w, a, e in zip(params, anchor, noise)] if has_b else []
    settings = {"keep_norms": keep_norms, "check_restart": has_b, "measure": True}  # along s: no restart
    reference = eager_plan(params, anchor, b, 0.7, mu, **settings, sum_across_ranks=None)
    before = [torch.full_like(p, math.nan) for p in params] if keep else []
    fused = plan(params, anchor, b, before, 0.7, mu, **settings)
    kept = [p.clone() for p in params]
    fused.commit(params, anchor, before)
    exact = all(torch.equal(x, y) for x, y in zip(before, kept)) and fused.restart == reference.restart
    made = [*reference.weights, *reference.weights, *reference.momentum]
    close_enough = [close(x, y) for x, y in zip([*params, *anchor, *b], made)]
    return exact and all(close_enough) and math.isclose(float(fused.size[0]), float(reference.size[0]), rel_tol=1e-6)
