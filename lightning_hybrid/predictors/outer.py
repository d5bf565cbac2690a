"""``outer``, the default rule: the SNOO outer-momentum rule (one-worker DiLoCo) with its guards, and the settings of
the verdict that keeps or undoes its jumps, so that everything the rule is set by lives here (the cycle's length,
``full_steps``, is the phase machine's, shared with the per-step mode)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import lightning_hybrid.predictors.outer_fused as outer_fused
from lightning_hybrid.offload import HostHeld, host_copies
from lightning_hybrid.predictors.outer_fused import FusedJumpPlan
from lightning_hybrid.predictors.outer_jump import JumpPlan, plan
from lightning_hybrid.predictors.parameter_sums import cosine_terms, state_fits
from lightning_hybrid.predictors.rules import TensorList, TrajectoryRule, load_into
from lightning_hybrid.settings import Bool, Float, Int, Settings, setting


@dataclass(eq=False)
class OuterMomentum(Settings, TrajectoryRule):
    """``outer``, the default: the SNOO rule (one-worker DiLoCo) with the guards the learning-rate harness measured.
    Every Full cycle of ``full_steps`` ordinary steps runs from an anchor; after it (as the engine starts the next
    step) the weights jump to ``anchor - outer_lr * (outer_momentum * b + s)``, where ``s = anchor - weights`` is the
    cycle's displacement and ``b <- outer_momentum * b + s``, and that point is the next anchor. No backward pass is
    added or skipped.

    A jump is judged at once for divergence (the monitor's ``z_threshold``) and, over the next cycle, by the delayed
    verdict set here. Memory: the anchor lives in the engine's one update buffer; ``b`` adds one parameter copy when
    ``outer_momentum > 0``, and delayed verification or the alignment verdict one more (the weights before the last
    jump, which the anchor, where it landed, turns into the jump). Each setting's field says what it does.
    """

    name = "outer"
    family = "jumps"

    outer_lr: float = setting(
        0.7,
        "η: every cycle ends with a jump to `anchor - η (μ b + s)`, `s = anchor - weights`, `b ← μ b + s`; that point "
        "is the next anchor. `outer_lr=1, outer_momentum=0` is plain training (bitwise)",
        Float(0.0, 2.0, open_low=True),
    )
    outer_momentum: float = setting(
        0.5, "μ, the outer momentum; 0 is Lookahead with step η", Float(0.0, 1.0, open_high=True)
    )
    alignment_window: int = setting(
        0,
        "jumps whose alignment decides whether jumping goes on (0: it always does). A jump's alignment is the "
        "cosine between it and the displacement of the cycle after it; once the mean over the last "
        "`alignment_window` jumps is ≤ 0, the jumps stop for the run (`jumps_stopped_at`). Opt-in: it fired too "
        "late in the harness",
        Int(0),
    )
    keep_norms: bool = setting(
        True,
        "scale each tensor back, after every jump, to the norm it had before it: the jumps change the weights' "
        "direction, not their scale (under normalization layers the scale sets the effective step of all later "
        "training). The weights before the jump are kept, so a rollback right after it gives them back bitwise. "
        "Under `hybrid_fsdp` each tensor's whole norm is its shards' squared norms summed over ranks (one "
        "collective a jump)",
        Bool(),
    )
    restart: bool = setting(
        True,
        "adaptive restart (O'Donoghue and Candès, 2015) at the cycle's scale: where a cycle's displacement points "
        "against the outer momentum (cosine ≤ 0, summed over ranks' shards), the momentum is reset and no jump is "
        "made (`jump_restarts` in the summary), so an oscillating run trains plainly. No parameter copy; nothing "
        "to do when `outer_momentum` is 0",
        Bool(),
    )
    state_on_host: bool | None = setting(
        None,
        "hold the outer momentum and the weights before the last jump in host memory (pinned) and bring them to "
        "the device only at a cycle's end, as DiLoCo implementations hold their outer state: the device holds one "
        "parameter copy above plain (the anchor), not three, at the price of copying the state in and out each "
        "cycle. `None`: on the device, unless those two copies would take more than half the GPU's free memory as "
        "training starts (then on the host, and the run says so); off the GPU the host is the device and it "
        "changes nothing. The same run bitwise (tested)",
        Bool(none_means="on CUDA"),
    )
    fused: bool = setting(
        True,
        "make each jump with two Triton kernels where they serve (CUDA with Triton, float32, unsharded, the state "
        "on the device): one pass reads the weights, the anchor and the momentum for every sum the jump needs, the "
        "other writes the weights, the anchor, the momentum and the weights kept, in place: 10 parameter copies of "
        "memory traffic, against the eager path's 23. Within float32 rounding of the eager jump (tested against its "
        "float64 formula, in Triton's interpreter on the CPU); checked against it on the device before training "
        "starts, and eager, said once, if it differs. `False`: the eager path everywhere",
        Bool(),
    )
    verify_window: int | None = setting(
        None,
        "the last this many steps of the cycle after a jump, whose mean loss keeps or rolls back the jump against "
        "the same window before it (≤ `full_steps`); 0 keeps every jump unchecked and holds no copy of it. `None`: "
        "half the cycle, `full_steps // 2` (10 at the default 20), so any `full_steps` set alone trains; the "
        "summary records the window used",
        Int(0, none_means="half the cycle"),
    )
    verify_sigmas: float = setting(
        2.0,
        "a jump is rolled back when that mean exceeds the window's mean before the jump by more than this many "
        "standard errors. A useful jump often raises the loss at first and pays once the optimizer has settled, "
        "so judging it right after would reject exactly those",
        Float(0.0, open_low=True),
    )
    verify_resolution: float = setting(
        0.2,
        "the widest margin, as a fraction of the window's mean loss, at which that verdict still judges: a cycle "
        "whose losses spread so widely that a larger rise would pass makes no jump (`jumps_blind` in the summary), "
        "so the run is plain there. For losses bounded below by 0; 0 sets no limit (a loss that can be negative)",
        Float(0.0),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.window = self.window_for(20)  # the default cycle's, until the run's is known (follow_cycle)
        self._b: list[Tensor] = []  # on the device; with ``state_on_host``, in ``_held`` instead
        self._before_jump: list[Tensor] = []  # the weights before the last jump, for its undo and its alignment
        self._held_move = False  # instead the jump itself, as checkpoints before 2026-12-02 hold it (see _before)
        self._held: dict[str, HostHeld] = {}
        self._set_up = False
        self.held_on_host = False  # b or the weights before the last jump on the host (read by the engine, to say so)
        self.sum_across_ranks: Callable[[Tensor], Tensor] | None = None  # set by the engine where ranks hold shards

    @property
    def moves(self) -> bool:
        """Whether a jump moves the weights at all (``η = 1, μ = 0`` is plain training: no jump, nothing to check)."""
        return self.outer_lr != 1.0 or self.outer_momentum > 0

    def window_for(self, full_steps: int) -> int:
        """The verdict's window for cycles of ``full_steps``: ``verify_window``, or by default half the cycle."""
        return self.verify_window if self.verify_window is not None else max(1, full_steps // 2)

    def follow_cycle(self, full_steps: int) -> None:
        """Take the run's cycle length: the default window follows it."""
        self.window = self.window_for(full_steps)

    def tolerance(self, spread: float) -> float:
        """How much higher the window's mean loss after a jump may be than before it, for losses that spread by
        ``spread`` within a window: ``verify_sigmas`` standard errors of the difference of two window means."""
        return self.verify_sigmas * spread * math.sqrt(2.0 / self.window)

    def blind(self, mean: float, spread: float) -> bool:
        """Whether the delayed verdict could not see a jump's harm, judged on a window of ``mean`` loss whose losses
        spread by ``spread``: its margin would exceed ``verify_resolution`` of the loss."""
        if self.verify_resolution == 0 or self.window == 0:
            return False
        return self.tolerance(spread) > self.verify_resolution * abs(mean)

    def setup(self, params: TensorList, keep_jump: bool) -> None:
        kept = {"b": self.outer_momentum > 0, "before_jump": keep_jump}
        on_host = self.state_on_host
        if on_host is None:  # the default: on the device, unless it would crowd a CUDA device's memory
            on_host = bool(params) and not state_fits(params, sum(kept.values()))
        # everything allocated before any of it is kept: nothing half set up. With on_host, allocated on the host:
        # the device never holds them outside a cycle's end
        held = {n: HostHeld(list(params)) for n, on in kept.items() if on and on_host}
        device = {n: [torch.zeros_like(p) for p in params] if on and not on_host else [] for n, on in kept.items()}
        self._held, self._b, self._before_jump = held, device["b"], device["before_jump"]
        self._held_move = False
        self.held_on_host, self._set_up = on_host and any(kept.values()), True
        sharded = self.sum_across_ranks is not None
        lists = [list(params), list(params), device["b"], device["before_jump"]]  # the anchor: the weights' sizes
        if self.fused and not held and outer_fused.usable(lists, sharded, self.keep_norms):
            outer_fused.launch_for(params)  # the kernels checked and their tables made before training starts
        self._apply_pending()

    def _momentum(self, write: bool = False) -> list[Tensor]:
        """``b`` on the device (empty when ``outer_momentum`` is 0)."""
        held = self._held.get("b")
        return held.on_device(write=write) if held is not None else self._b

    def _before(self, anchor: list[Tensor], fill: bool = True) -> list[Tensor]:
        """The weights before the last jump on the device (empty when no verdict needs it); ``fill=False``: about
        to be overwritten. A checkpoint written before 2026-12-02 held the jump ``d`` instead: ``anchor - d``, once."""
        held = self._held.get("before_jump")
        before = held.on_device(fill=fill, write=self._held_move) if held is not None else self._before_jump
        if self._held_move and fill:
            with torch.no_grad():
                torch._foreach_sub_(before, anchor)
                torch._foreach_neg_(before)
        self._held_move = False
        return before

    def put_away(self) -> None:
        """A cycle's end is over: with ``state_on_host``, ``b`` and the weights kept go back to the host."""
        for held in self._held.values():
            held.put_away()

    def jump(self, params: list[Tensor], anchor: list[Tensor], measure: bool = True) -> JumpPlan | FusedJumpPlan:
        """The cycle's end: move ``params`` in place to the new anchor, which ``anchor``'s items become, unless
        ``restart`` finds the cycle pointing against the momentum (then the momentum is reset and nothing moves:
        the returned plan's ``restart``). With ``measure``, the plan's ``size`` is ``[|d|², |weights|²]`` over every
        rank, ``d`` the jump before ``keep_norms`` scales the tensors back.

        Everything that can fail (an allocation, the collective, the read of the host) comes before the first write
        (:mod:`~lightning_hybrid.predictors.outer_jump`): a jump that raises leaves the weights, the anchor, the
        momentum and the weights kept for an undo as they were, bitwise. On shards (``sum_across_ranks`` set), each
        tensor's norms are its shards' squared norms summed over ranks: one collective a jump. On CUDA, the two
        kernels of :mod:`~lightning_hybrid.predictors.outer_fused` make it where they serve."""
        mu, b = self.outer_momentum, self._momentum()
        settings = {"keep_norms": self.keep_norms, "check_restart": self.restart and mu > 0, "measure": measure}
        sharded = self.sum_across_ranks is not None
        try:
            if (
                self.fused
                and not self._held
                and outer_fused.usable([params, anchor, b, self._before_jump], sharded, self.keep_norms)
            ):
                planned: JumpPlan | FusedJumpPlan = outer_fused.plan(
                    params, anchor, b, self._before_jump, self.outer_lr, mu, **settings
                )
            else:
                planned = plan(params, anchor, b, self.outer_lr, mu, **settings, sum_across_ranks=self.sum_across_ranks)
            if not planned.restart:  # in place from here on: nothing allocates or waits, nothing fails half-way
                planned.commit(params, anchor, self._before(anchor, fill=False))  # for an undo
        except BaseException:
            for held in self._held.values():
                held.drop()  # nothing of the run's was written: the host values stand
            raise
        if planned.restart:
            self.reset_momentum()
        elif mu > 0 and "b" in self._held:
            torch._foreach_copy_(self._held["b"].on_device(write=True), planned.momentum)
        elif mu > 0:
            self._b = planned.momentum  # the plan's b' becomes the momentum
        self.put_away()
        return planned

    def alignment_terms(self, params: list[Tensor], anchor: list[Tensor]) -> Tensor:
        """``[d · jump, |d|², |jump|²]`` over this rank's tensors, ``d = params - anchor`` the displacement since
        the last jump and ``jump = anchor - before`` (two parameter copies while they are summed, as many as a jump
        makes). Summed over ranks, their cosine is the jump's alignment."""
        with torch.no_grad():
            jump = torch._foreach_sub(anchor, self._before(anchor))
            return cosine_terms(torch._foreach_sub(params, anchor), jump)

    def reset_momentum(self) -> None:
        held = self._held.get("b")
        if held is not None:
            held.zero_()  # on the host: nothing to move
            return
        with torch.no_grad():
            torch._foreach_zero_(self._b)

    def undo(self, params: list[Tensor], anchor: list[Tensor]) -> None:
        """Take the last jump, ``anchor - before``, back out of ``params`` (keeping the ordinary steps since) and
        ``anchor`` (back to ``before``), and restart the outer momentum: the failed extrapolation must not carry
        into the next one."""
        before = self._before(anchor)
        with torch.no_grad():
            torch._foreach_sub_(params, anchor)
            torch._foreach_add_(params, before)
            torch._foreach_copy_(anchor, before)
        if self.outer_momentum > 0:
            self.reset_momentum()
        self.put_away()

    def _values(self, name: str) -> list[Tensor]:
        held = self._held.get(name)
        return held.values() if held is not None else host_copies(getattr(self, f"_{name}"))

    def release(self) -> None:
        if self._set_up:
            self._released = self.state_dict()
            self._b, self._before_jump, self._held, self._set_up = [], [], {}, False

    def state_dict(self) -> dict[str, Any]:
        """``b``, and the weights before the last jump (``"before_jump"``; a checkpoint's jump not yet turned into
        them stays ``"jump"``, as it was loaded)."""
        if not self._set_up:
            return self._parked({"b": [], "before_jump": []})
        return {"b": self._values("b"), "jump" if self._held_move else "before_jump": self._values("before_jump")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's ``b`` and the weights before its last jump, or, written before 2026-12-02, that jump."""
        move = "before_jump" not in state
        kept = state["jump"] if move else state["before_jump"]
        if not self._set_up:
            if state["b"] or kept:
                self._park(state)
            return
        for name, what, values in (("b", "outer momentum", state["b"]), ("before_jump", "last jump", kept)):
            held, tensors = self._held.get(name), getattr(self, f"_{name}")
            if (held is None and not tensors) or (name == "before_jump" and not values):
                continue
            if held is not None:
                held.drop()
                tensors = held.host
            load_into("OuterMomentum", what, tensors, values)
            if name == "before_jump":
                self._held_move = move
