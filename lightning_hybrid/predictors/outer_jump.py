"""The ``outer`` rule's jump in two parts, so that a jump that fails leaves nothing half-done: :func:`plan` does
everything that can fail (allocating, summing over ranks, reading the host) while the run's tensors are only read,
and :meth:`JumpPlan.commit` then makes it with one copy into the weights, which allocates nothing and waits for
nothing; the new anchor, momentum and last jump are the plan's own tensors, taken over without a copy.

The restart's cosine, the jump's size and ``keep_norms``' scales come out of one fused norm over the displacement,
the momentum before and after, and the weights before and after, read as squared sums in float64, whose differences
give the dot products (``2 μ s·b = |s + μ b|² - |s|² - μ²|b|²``). Where the restart or ``keep_norms`` reads the
host, it reads every norm at once, and the scales go back as the scalars of one fused multiplication."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class JumpPlan:
    """A jump computed and not yet made: the new momentum ``b'``, the weights it lands on, the move, and what was
    decided."""

    momentum: list[Tensor]  # b' = μ b + s (empty when μ = 0)
    weights: list[Tensor]  # where the jump lands: the new weights, and the next anchor
    moved: list[Tensor]  # the move, kept for an undo (empty unless asked for)
    restart: bool  # the cycle pointed against the momentum: reset it and make no jump
    size: Tensor | tuple[float, float] | None  # [|d|², |w|²] over every rank, d the jump before keep_norms

    def commit(self, params: list[Tensor], anchor: list[Tensor]) -> None:
        """Make the jump: ``anchor``'s items become the new weights (a list: nothing is written yet where it is
        not), and ``params`` are copied to them, in place."""
        anchor[:] = self.weights
        with torch.no_grad():
            torch._foreach_copy_(params, self.weights)


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
    params``, ``b' = μ b + s``, the weights ``params + d`` with ``d = (1 - η) s - η μ b' = (1 - η - ημ) s - ημ² b``
    (each tensor scaled back to its norm with ``keep_norms``); with ``keep_move``, the move to them too, kept for an
    undo. With ``check_restart``, ``restart`` is whether ``s · b <= 0`` (both nonzero). The restart and
    ``keep_norms`` read the host once between them. ``sum_across_ranks``: where ranks hold shards, the one
    collective, over every squared norm."""
    n, judged = len(params), check_restart or measure
    with torch.no_grad():
        s = torch._foreach_sub(anchor, params)
        momentum = torch._foreach_add(s, b, alpha=mu) if mu > 0 else []
        weights = torch._foreach_add(params, s, alpha=1.0 - eta - eta * mu)
        if mu > 0:
            torch._foreach_add_(weights, b, alpha=-eta * mu * mu)
        rows = {"s": s if judged else [], "b": b if judged else [], "moved": momentum if judged else []}
        rows |= {"w": params if keep_norms or measure else [], "after": weights if keep_norms else []}
        listed = [t for tensors in rows.values() for t in tensors]
        norms = torch.stack(torch._foreach_norm(listed, dtype=torch.float64)) if listed else None  # float64: exact
        if sum_across_ranks is not None and norms is not None:  # each tensor's norm over every rank's shards
            norms = sum_across_ranks(norms.square()).sqrt()
        lengths = {name: len(tensors) for name, tensors in rows.items()}
        del s, rows, listed  # the displacement is no longer needed: freed before the move is allocated
        restart, size = False, None
        if check_restart or keep_norms:
            restart, size = _on_host(norms, lengths, weights, eta, mu, check_restart, keep_norms, measure)
        elif measure:
            size = _size(_totals(norms, lengths, n), eta, mu)
        moved = torch._foreach_sub(weights, params) if keep_move and not restart else []
    return JumpPlan(momentum, weights, moved, restart, size)


def _on_host(
    norms: Tensor | None,
    lengths: dict[str, int],
    weights: list[Tensor],
    eta: float,
    mu: float,
    check_restart: bool,
    keep_norms: bool,
    measure: bool,
) -> tuple[bool, tuple[float, float] | None]:
    """Read every norm in one read of the host: decide the restart, and scale the new weights back to the norms
    the old ones had (``keep_norms``); with ``measure``, the jump's size."""
    read = norms.tolist() if norms is not None else []  # the one read of the host
    at, start = {}, 0
    for name, length in lengths.items():
        at[name], start = read[start : start + length], start + length
    totals = {name: math.fsum(v * v for v in values) for name, values in at.items()}
    restart = check_restart and _against(totals["s"], totals["b"], totals["moved"], mu)
    if keep_norms and not restart and weights:
        tiny = sys.float_info.min
        torch._foreach_mul_(weights, [w / max(a, tiny) for w, a in zip(at["w"], at["after"])])
    return restart, (tuple(_size(totals, eta, mu)) if measure else None)


def _totals(norms: Tensor | None, lengths: dict[str, int], n: int) -> dict[str, Tensor]:
    """The sum of squared norms of each row present (each ``n`` tensors long), on the device."""
    present = [name for name, length in lengths.items() if length]
    sums = norms.view(len(present), n).square().sum(dim=1).unbind() if norms is not None else []
    return dict(zip(present, sums))


def _against(s_sq: float, b_sq: float, moved_sq: float, mu: float) -> bool:
    """Whether the cycle's displacement points against the momentum, from ``Σ|s|², Σ|b|², Σ|b'|²``: ``s · b <= 0``,
    both nonzero."""
    return s_sq > 0 and b_sq > 0 and moved_sq - s_sq - mu * mu * b_sq <= 0


def _size(totals: dict[str, Any], eta: float, mu: float) -> Any:
    """``[|d|², |w|²]`` from the squared sums, floats on the host or tensors on the device: ``d = c_s s + c_b b``,
    ``2 μ s · b = |b'|² - |s|² - μ²|b|²``."""
    s_sq, w_sq = totals["s"], totals["w"]
    c_s, c_b = 1.0 - eta - eta * mu, -eta * mu * mu
    d_sq = c_s * c_s * s_sq
    if mu > 0:
        b_sq = totals["b"]
        dot = (totals["moved"] - s_sq - mu * mu * b_sq) / (2 * mu)
        d_sq = d_sq + c_b * c_b * b_sq + 2 * c_s * c_b * dot
    return (d_sq, w_sq) if isinstance(d_sq, float) else torch.stack([d_sq, w_sq])
