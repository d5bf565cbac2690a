"""Trajectory rules: prediction that keeps every backward pass and moves the weights along their trajectory over
many steps, the family published work finds paying for full-rank training (SNOO / one-worker DiLoCo, primal
averaging), as opposed to the per-step :class:`~lightning_hybrid.predictors.Predictor` that replaces backward
passes.

A rule works on this rank's flat list of trainable tensors (its shards under FSDP) with fused ``torch._foreach_*``
operations; the engine decides when it acts, verifies and undoes what it did.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from lightning_hybrid.validation import check_bool, check_float, check_int

TensorList = Sequence[Tensor]


def _host(tensors: TensorList) -> list[Tensor]:
    return [t.detach().to("cpu", copy=True) for t in tensors]


def _load_into(owner: str, what: str, dst: list[Tensor], src: list[Tensor]) -> None:
    if [tuple(t.shape) for t in dst] != [tuple(t.shape) for t in src]:
        raise ValueError(f"{owner}: the checkpoint's {what} does not match the model's trainable tensors")
    with torch.no_grad():
        torch._foreach_copy_(dst, [s.to(d.device) for s, d in zip(src, dst)])


class TrajectoryRule(ABC):
    """Base class of trajectory rules; subclasses are registered by their ``name`` beside the predictors.

    Rules are not gated by the learning rate (``predict_lr_fraction``) and use no horizon bandit: they never skip
    a backward pass, so the regimes where per-step prediction failed do not apply to them.
    """

    name: ClassVar[str]
    family: ClassVar[str]  # the prediction family that runs the rule (``lightning_hybrid.engine.families``)

    @abstractmethod
    def setup(self, params: TensorList, keep_jump: bool) -> None:
        """Allocate state shaped like ``params`` (this rank's trainable tensors, flat). ``keep_jump``: the engine
        verifies jumps after the fact, so the last one must be kept to be undone."""

    def confidence(self) -> float:
        """Rules make no one-step prediction to be confident about; reported as 1 in the scalars."""
        return 1.0

    def uncertainty(self) -> float:
        return 0.0

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state; may be called before :meth:`setup`, which then applies it."""


def _cosine_terms(params: TensorList, pairs: Iterable[tuple[Tensor, Tensor]]) -> Tensor:
    """``[x · y, |x|², |y|²]`` summed over ``pairs`` of tensors, in float64, taken one pair at a time so that a
    difference in a pair never exists for more than one tensor (no parameter copy)."""
    terms = torch.zeros(3, dtype=torch.float64, device=params[0].device if params else "cpu")
    with torch.no_grad():
        for x, y in pairs:
            x, y = x.flatten().double(), y.flatten().double()
            terms += torch.stack((torch.dot(x, y), torch.dot(x, x), torch.dot(y, y)))
    return terms


class OuterMomentum(TrajectoryRule):
    """``outer``: the SNOO rule (one-worker DiLoCo). Every Full cycle of ``full_steps`` ordinary steps runs from an
    anchor; after it (as the engine starts the next step) the weights jump to
    ``anchor - outer_lr * (outer_momentum * b + s)``, where ``s = anchor - weights`` is the cycle's displacement and
    ``b <- outer_momentum * b + s``, and that point is the next anchor. No backward pass is added or skipped.

    ``outer_lr=1, outer_momentum=0`` is plain training (bitwise); ``outer_momentum=0`` is Lookahead with step
    ``outer_lr``. Memory: the anchor lives in the engine's one update buffer; ``b`` adds one parameter copy when
    ``outer_momentum > 0``, and delayed verification or the alignment verdict one more (the last jump).

    The alignment verdict asks whether a jump went where training was going anyway, the question a loss compared
    with before the jump cannot answer on a falling curve: the cosine between each jump and the displacement of the
    cycle after it. Positive, training carries on along the jump (a longer one would have paid too); negative, it
    walks the jump back (it overshot). Once the mean over the last ``alignment_window`` jumps is at most 0, the
    jumps stop for the rest of the run and training is plain.

    Args:
        outer_lr: η, the outer step, in ``(0, 2]``.
        outer_momentum: μ, the outer momentum, in ``[0, 1)``.
        alignment_window: jumps whose mean alignment decides whether jumping goes on (0: it always does).
        keep_norms: scale each tensor back, after every jump, to the norm it had before it: jumps then change the
            weights' direction, not their scale (which, under normalization layers, sets the effective step of all
            later training). Not under ``hybrid_fsdp``.
        restart: adaptive restart (O'Donoghue and Candès, 2015) at the cycle's scale: when a cycle's displacement
            points against the outer momentum (their cosine is at most 0), the momentum is reset and no jump is
            made, so that an oscillating run trains plainly instead of being pushed along a stale direction.
    """

    name = "outer"
    family = "jumps"

    def __init__(
        self,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.5,
        alignment_window: int = 0,
        keep_norms: bool = False,
        restart: bool = False,
    ) -> None:
        self.outer_lr = check_float("OuterMomentum", "outer_lr", outer_lr, 0.0, 2.0, open_low=True)
        self.outer_momentum = check_float("OuterMomentum", "outer_momentum", outer_momentum, 0.0, 1.0 - 1e-12)
        self.alignment_window = check_int("OuterMomentum", "alignment_window", alignment_window, 0)
        self.keep_norms = check_bool("OuterMomentum", "keep_norms", keep_norms)
        self.restart = check_bool("OuterMomentum", "restart", restart)
        if restart and outer_momentum == 0:
            raise ValueError("OuterMomentum: `restart=True` resets the outer momentum, so it needs outer_momentum > 0")
        self._b: list[Tensor] = []
        self._jump: list[Tensor] = []
        self._pending: dict[str, Any] | None = None

    @property
    def moves(self) -> bool:
        """Whether a jump moves the weights at all (``η = 1, μ = 0`` is plain training: no jump, nothing to check)."""
        return self.outer_lr != 1.0 or self.outer_momentum > 0

    def setup(self, params: TensorList, keep_jump: bool) -> None:
        self._b = [torch.zeros_like(p) for p in params] if self.outer_momentum > 0 else []
        self._jump = [torch.zeros_like(p) for p in params] if keep_jump else []
        if self._pending is not None:
            state, self._pending = self._pending, None
            self.load_state_dict(state)

    def jump(self, params: list[Tensor], anchor: list[Tensor]) -> None:
        """The cycle's end: move ``params`` in place to the new anchor and leave it in ``anchor`` too.

        ``params += (1 - η) s - η μ b`` with ``b`` already updated by ``s``: the same point as
        ``anchor - η (μ b + s)``, written as a displacement so that ``η = 1, μ = 0`` adds nothing.
        """
        eta, mu = self.outer_lr, self.outer_momentum
        with torch.no_grad():
            torch._foreach_sub_(anchor, params)  # anchor := s
            if mu > 0:
                torch._foreach_mul_(self._b, mu)
                torch._foreach_add_(self._b, anchor)  # b := μ b + s
            torch._foreach_mul_(anchor, 1.0 - eta)  # anchor := the jump d = (1 - η) s - η μ b
            if mu > 0:
                torch._foreach_add_(anchor, self._b, alpha=-eta * mu)
            before = torch._foreach_norm(params) if self.keep_norms else None
            torch._foreach_add_(params, anchor)
            if self._jump:
                torch._foreach_copy_(self._jump, anchor)
            if before is not None:
                self._scale_back(params, before)
            torch._foreach_copy_(anchor, params)

    def _scale_back(self, params: list[Tensor], before: list[Tensor]) -> None:
        """``params *= before / |params|`` per tensor; the kept jump becomes the move actually made,
        ``d + params (1 - 1/scale)``, so that :meth:`undo` still lands on the weights before the jump."""
        after = torch._foreach_norm(params)
        torch._foreach_clamp_min_(after, torch.finfo(params[0].dtype).tiny)
        scale = torch._foreach_div(before, after)
        torch._foreach_mul_(params, scale)
        if self._jump:
            torch._foreach_reciprocal_(scale)
            torch._foreach_neg_(scale)
            torch._foreach_add_(scale, 1.0)  # 1 - 1/scale
            torch._foreach_addcmul_(self._jump, params, scale)

    def alignment_terms(self, params: TensorList, anchor: TensorList) -> Tensor:
        """``[jump · d, |jump|², |d|²]`` over this rank's tensors, ``d = params - anchor`` the displacement since the
        last jump (one tensor's difference at a time: no parameter copy). Summed over ranks, their cosine is the
        jump's alignment."""
        return _cosine_terms(params, ((j, p - a) for p, a, j in zip(params, anchor, self._jump, strict=True)))

    def momentum_terms(self, params: TensorList, anchor: TensorList) -> Tensor:
        """``[s · b, |s|², |b|²]`` over this rank's tensors, ``s = anchor - params`` the cycle's displacement and ``b``
        the outer momentum before it takes ``s`` in (one tensor at a time: no parameter copy). Summed over ranks,
        their cosine decides a restart."""
        return _cosine_terms(params, ((a - p, b) for p, a, b in zip(params, anchor, self._b, strict=True)))

    def reset_momentum(self) -> None:
        with torch.no_grad():
            torch._foreach_zero_(self._b)

    def undo(self, params: list[Tensor], anchor: list[Tensor]) -> None:
        """Take the last jump back out of ``params`` and ``anchor`` (keeping the ordinary steps since), and restart
        the outer momentum: the failed extrapolation must not carry into the next one."""
        with torch.no_grad():
            torch._foreach_sub_(params, self._jump)
            torch._foreach_sub_(anchor, self._jump)
        if self._b:
            self.reset_momentum()

    def state_dict(self) -> dict[str, Any]:
        return {"b": _host(self._b), "jump": _host(self._jump)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._b and not self._jump and (state["b"] or state["jump"]):
            self._pending = state  # before setup: applied there
            return
        if self._b:
            _load_into("OuterMomentum", "outer momentum", self._b, state["b"])
        if self._jump and state["jump"]:
            _load_into("OuterMomentum", "last jump", self._jump, state["jump"])


class PrimalAverage(TrajectoryRule):
    """``average``: generalized primal averaging on top of the user's optimizer.

    The optimizer's own sequence ``z`` takes its steps from gradients computed at
    ``y = average_y * x + (1 - average_y) * z``, and the averaged sequence ``x <- average_x * x + (1 - average_x) * z``
    is the model that validation, checkpoints and the end of ``fit`` see (as with Lightning's weight-averaging
    callbacks). The trained parameters hold ``y`` between steps; ``z`` is recomputed from ``y`` and ``x`` just
    before each optimizer step, so the rule holds one parameter copy (``x``). No backward pass is added or skipped.
    ``average_x`` of 0.9934 / 0.9967 / 0.9984 corresponds to DiLoCo with 16 / 32 / 64 inner steps.

    Args:
        average_x: μ_x, the weight of the old average per step, in ``[0, 1)``.
        average_y: μ_y, where gradients are taken between the average and the optimizer's sequence, in ``[0, 1)``.
    """

    name = "average"
    family = "averaging"

    def __init__(self, average_x: float = 0.9869, average_y: float = 0.7) -> None:
        self.average_x = check_float("PrimalAverage", "average_x", average_x, 0.0, 1.0 - 1e-12)
        self.average_y = check_float("PrimalAverage", "average_y", average_y, 0.0, 1.0 - 1e-12)
        self._x: list[Tensor] = []
        self._pending: dict[str, Any] | None = None

    def setup(self, params: TensorList, keep_jump: bool) -> None:
        self._x = [p.detach().clone() for p in params]
        if self._pending is not None:
            state, self._pending = self._pending, None
            self.load_state_dict(state)

    @property
    def average(self) -> list[Tensor]:
        return self._x

    def restart(self, params: TensorList) -> None:
        """Averaging starts (after warmup): ``x = y = z`` at the current weights."""
        with torch.no_grad():
            torch._foreach_copy_(self._x, list(params))

    def to_optimizer_sequence(self, params: list[Tensor]) -> None:
        """After the backward pass, before the update: ``params`` (``y``) become ``z = (y - μ_y x) / (1 - μ_y)``."""
        if self.average_y == 0:
            return
        with torch.no_grad():
            torch._foreach_add_(params, self._x, alpha=-self.average_y)
            torch._foreach_div_(params, 1.0 - self.average_y)

    def to_gradient_point(self, params: list[Tensor]) -> None:
        """After the optimizer step on ``z``: fold it into ``x``, then move ``params`` to ``y``."""
        with torch.no_grad():
            torch._foreach_lerp_(self._x, params, 1.0 - self.average_x)
            if self.average_y > 0:
                torch._foreach_lerp_(params, self._x, self.average_y)

    def back_to_gradient_point(self, params: list[Tensor]) -> None:
        """Undo :meth:`to_optimizer_sequence` when no update followed (``y = μ_y x + (1 - μ_y) z``)."""
        if self.average_y > 0:
            with torch.no_grad():
                torch._foreach_lerp_(params, self._x, self.average_y)

    def state_dict(self) -> dict[str, Any]:
        return {"x": _host(self._x)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._x:
            self._pending = state
            return
        _load_into("PrimalAverage", "average", self._x, state["x"])
