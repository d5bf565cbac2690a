"""The ``outer`` rule's jump in two parts, so that a jump that fails leaves nothing half-done: :func:`plan` does
everything that can fail (allocating, summing over ranks, reading the host) while the run's tensors are only read,
and :meth:`JumpPlan.commit` then writes them with in-place operations that allocate nothing and wait for nothing.

The restart's cosine, the jump, its size and ``keep_norms``' scales come out of the same passes: two norms over
the displacement, the momentum and the weights before and after, read as squared sums in float64, whose
differences give the dot products (``2 μ s·b = |s + μ b|² - |s|² - μ²|b|²``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class JumpPlan:
    """A jump computed and not yet made: the new momentum ``b'``, the move, and what was decided."""

    momentum: list[Tensor]  # b' = μ b + s (empty when μ = 0)
    moved: list[Tensor]  # the move to make, after keep_norms (``is_move``); else the new weights themselves
    is_move: bool
    restart: bool  # the cycle pointed against the momentum: reset it and make no jump
    size: Tensor | None  # [|d|², |w|²] over every rank, d the jump before keep_norms

    def commit(self, params: list[Tensor], anchor: list[Tensor]) -> None:
        """Make the jump: ``params`` and ``anchor`` to the new weights, in place."""
        with torch.no_grad():
            if self.is_move:
                torch._foreach_add_(params, self.moved)
                torch._foreach_copy_(anchor, params)
            else:
                torch._foreach_copy_(params, self.moved)
                torch._foreach_copy_(anchor, self.moved)


def plan(
    params: list[Tensor],
    anchor: list[Tensor],
    b: list[Tensor],
    eta: float,
    mu: float,
    *,
    keep_norms: bool,
    keep_move: bool,
    check_restart: bool,
    measure: bool,
    sum_across_ranks: Callable[[Tensor], Tensor] | None,
) -> JumpPlan:
    """The jump from ``anchor`` after a cycle that ended at ``params`` with outer momentum ``b``: ``s = anchor -
    params``, ``b' = μ b + s``, ``d = (1 - η) s - η μ b'``, the weights ``params + d`` (each tensor scaled back to
    its norm with ``keep_norms``); with ``keep_move``, the plan holds the move to them instead, kept for an undo.
    With ``check_restart``, ``restart`` is whether ``s · b <= 0`` (both nonzero): the one read of the host.
    ``sum_across_ranks``: where ranks hold shards, the one collective, over every squared norm."""
    n = len(params)
    with torch.no_grad():
        momentum = torch._foreach_sub(anchor, params)  # s
        first = ["s", "b"] if mu > 0 and (check_restart or measure) else []  # before s becomes b'
        norms = list(torch._foreach_norm([*momentum, *b], dtype=torch.float64)) if first else []
        if mu > 0:
            torch._foreach_add_(momentum, b, alpha=mu)  # b' = s + μ b
        weights = torch._foreach_add(params, momentum, alpha=1.0 - eta - eta * mu)  # d = (1-η-ημ) b' - (1-η) μ b
        if mu > 0:
            torch._foreach_add_(weights, b, alpha=-(1.0 - eta) * mu)
        rows = [*first, *(["moved"] if check_restart or measure else []), *(["w"] if keep_norms or measure else [])]
        rows += ["after"] if keep_norms else []
        listed = {"moved": momentum, "w": params, "after": weights}
        later = [t for name in rows[len(first) :] for t in listed[name]]
        norms += torch._foreach_norm(later, dtype=torch.float64) if later else []  # float64: exact sums
        if sum_across_ranks is not None and norms:  # each tensor's norm over every rank's shards
            norms = list(sum_across_ranks(torch.stack(norms).square()).sqrt().unbind())
        at = {name: norms[i * n : (i + 1) * n] for i, name in enumerate(rows)}
        restart, size = False, None
        if check_restart or measure:  # the sums, Σ|s|, Σ|b|, Σ|b'| and Σ|w|, in float64
            count = len(rows) - ("after" in rows)
            stacked = torch.stack(norms[: count * n]).view(count, n)
            totals = torch.linalg.vector_norm(stacked, dim=1, dtype=torch.float64)
            if check_restart:
                restart = _against([t * t for t in totals[:3].tolist()], mu)  # the one read of the host
            size = _size(totals.square(), eta, mu, "b" in rows) if measure else None
        if keep_norms and not restart and n:
            _scale_back(weights, at["w"], at["after"])
        if keep_move and not restart:
            torch._foreach_sub_(weights, params)  # the move made
    return JumpPlan(momentum if mu > 0 else [], weights, keep_move and not restart, restart, size)


def _against(sums: list[float], mu: float) -> bool:
    """Whether the cycle's displacement points against the momentum, from ``Σ|s|², Σ|b|², Σ|b'|²``: ``s · b <= 0``,
    both nonzero."""
    s_sq, b_sq, moved_sq = sums
    return s_sq > 0 and b_sq > 0 and moved_sq - s_sq - mu * mu * b_sq <= 0


def _size(totals: Tensor, eta: float, mu: float, with_b: bool) -> Tensor:
    """``[|d|², |w|²]`` from the squared sums (``[|s|², |b|²]`` with ``with_b``, ``|b'|², |w|²``): ``d = c₁ b' + c₂
    b``, ``b' · b = μ |b|² + s · b``."""
    if not with_b:  # d = (1 - η) s
        return totals[:2] * torch.tensor([(1.0 - eta) ** 2, 1.0], dtype=totals.dtype, device=totals.device)
    c1, c2 = 1.0 - eta - eta * mu, -(1.0 - eta) * mu
    s_sq, b_sq, moved_sq, w_sq = totals[:4].unbind()
    dot = (moved_sq - s_sq + mu * mu * b_sq) / (2 * mu)  # b' · b
    return torch.stack([c1 * c1 * moved_sq + c2 * c2 * b_sq + 2 * c1 * c2 * dot, w_sq])


def _scale_back(weights: list[Tensor], before: list[Tensor], after: list[Tensor]) -> None:
    """Scale each tensor of ``weights`` (float64 norms ``after``) to the norm ``before``, in place."""
    torch._foreach_clamp_min_(after, torch.finfo(after[0].dtype).tiny)
    scale = torch._foreach_div(before, after)
    dtypes = {w.dtype for w in weights}
    if len(dtypes) == 1:  # one cast for all: the multiplication stays one fused operation
        scale = list(torch.stack(scale).to(dtypes.pop()).unbind())
    else:
        scale = [s.to(w.dtype) for s, w in zip(scale, weights)]
    torch._foreach_mul_(weights, scale)
