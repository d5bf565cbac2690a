"""The ``outer`` rule's jump in two parts, so that a jump that fails leaves nothing half-done: :func:`plan` does
everything that can fail (allocating, summing over ranks, reading the host) while the run's tensors are only read,
and :meth:`JumpPlan.commit` then makes it in place, allocating nothing and waiting for nothing: the weights kept for
an undo and then overwritten; the new anchor and momentum are the plan's own tensors, taken over.

The restart's cosine, the jump's size and ``keep_norms``' scales come out of two fused norms, over the displacement
and the momentum, then the new momentum and the weights before and after, read as squared sums in float64, whose
differences give the dot products (``2 μ s·b = |s + μ b|² - |s|² - μ²|b|²``). Where the restart or ``keep_norms``
reads the host, it reads every norm at once, and the scales go back as the scalars of one fused multiplication."""

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
    """A jump computed and not yet made: the new momentum ``b'``, the weights it lands on, and what was decided."""

    momentum: list[Tensor]  # b' = μ b + s (empty when μ = 0)
    weights: list[Tensor]  # where the jump lands: the new weights, and the next anchor
    restart: bool  # the cycle pointed against the momentum: reset it and make no jump
    size: Tensor | tuple[float, float] | None  # [|d|², |w|²] over every rank, d the jump before keep_norms

    def commit(self, params: list[Tensor], anchor: list[Tensor], before: list[Tensor]) -> None:
        """Make the jump, in place: ``params`` copied into ``before`` (for an undo, which the anchor, the weights
        it lands on, turns into the move; nothing where it is empty) and then to the new weights, and ``anchor``'s
        items (a list) become them."""
        with torch.no_grad():
            if before:
                torch._foreach_copy_(before, params)
            torch._foreach_copy_(params, self.weights)
        anchor[:] = self.weights


def plan(
    params: list[Tensor],
    anchor: list[Tensor],
    b: list[Tensor],
    eta: float,
    mu: float,
    *,
    keep_norms: bool,
    check_restart: bool,
    measure: bool,
    sum_across_ranks: Callable[[Tensor], Tensor] | None,
) -> JumpPlan:
    """The jump from ``anchor`` after a cycle that ended at ``params`` with outer momentum ``b``: ``s = anchor -
    params``, ``b' = μ b + s``, the weights ``params + d`` with ``d = (1 - η) s - η μ b' = (1 - η - ημ) b' - (1 -
    η) μ b``, each tensor scaled back to its norm with ``keep_norms``. With ``check_restart``, ``restart`` is whether
    ``s · b <= 0`` (both nonzero). The restart and ``keep_norms`` read the host once between them.
    ``sum_across_ranks``: where ranks hold shards, the one collective, over every squared norm.

    Two parameter-sized tensors are allocated (``b'``, made in place from ``s`` once its norm is taken, and the new
    weights): with the weights, the anchor, ``b`` and the weights before the last jump, the most a jump holds at
    once."""
    n, judged = len(params), check_restart or measure
    with torch.no_grad():
        momentum = torch._foreach_sub(anchor, params)  # s, and b' once its norm is taken
        rows = {"s": momentum if judged else [], "b": b if judged else []}  # lengths only, once the norms are read
        first = [*rows["s"], *rows["b"]]
        norms = list(torch._foreach_norm(first, dtype=torch.float64)) if first else []  # float64: exact sums
        if mu > 0:
            torch._foreach_add_(momentum, b, alpha=mu)
        weights = torch._foreach_add(params, momentum, alpha=1.0 - eta - eta * mu)
        if mu > 0:
            torch._foreach_add_(weights, b, alpha=-(1.0 - eta) * mu)
        rows |= {"moved": momentum if judged and mu > 0 else [], "w": params if keep_norms or measure else []}
        rows["after"] = weights if keep_norms else []
        later = [*rows["moved"], *rows["w"], *rows["after"]]
        norms += torch._foreach_norm(later, dtype=torch.float64) if later else []
        stacked = torch.stack(norms) if norms else None
        if sum_across_ranks is not None and stacked is not None:  # each tensor's norm over every rank's shards
            stacked = sum_across_ranks(stacked.square()).sqrt()
        lengths = {name: len(tensors) for name, tensors in rows.items()}
        restart, size = False, None
        if check_restart or keep_norms:
            restart, size = _on_host(stacked, lengths, weights, eta, mu, check_restart, keep_norms, measure)
        elif measure:
            size = _size(_totals(stacked, lengths, n), eta, mu)
    return JumpPlan(momentum if mu > 0 else [], weights, restart, size)


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
    return restart, (_size(totals, eta, mu) if measure else None)


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
    """``[|d|², |w|²]`` from the squared sums, floats on the host or tensors on the device: ``d = (1 - η - ημ) s -
    ημ² b``, ``2 μ s · b = |b'|² - |s|² - μ²|b|²``."""
    s_sq, w_sq = totals["s"], totals["w"]
    c_s, c_b = 1.0 - eta - eta * mu, -eta * mu * mu
    d_sq = c_s * c_s * s_sq
    if mu > 0:
        b_sq = totals["b"]
        dot = (totals["moved"] - s_sq - mu * mu * b_sq) / (2 * mu)
        d_sq = d_sq + c_b * c_b * b_sq + 2 * c_s * c_b * dot
    return (d_sq, w_sq) if isinstance(d_sq, float) else torch.stack([d_sq, w_sq])
