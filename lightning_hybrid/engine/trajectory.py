"""Trajectory rules in the engine: when a :class:`~lightning_hybrid.predictors.TrajectoryRule` acts, and how an
outer-momentum jump is verified over a delayed window and undone. The part of :class:`~.engine.HybridEngine` used
instead of Predict segments when the predictor is a rule.

``outer``: the store's update buffer holds the anchor; every Full cycle ends with a jump, made as the next step
starts, judged once at that step for divergence and then by the mean loss of the last ``verify_window`` steps of
the cycle it starts. ``average``: every ordinary step after warmup takes the optimizer's step on the optimizer's
sequence and returns the weights to the gradient point; validation and the end of ``fit`` see the average, through
the same buffer.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_hybrid.engine.store import copy_
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors.rules import OuterMomentum, PrimalAverage, TrajectoryRule


@dataclass
class TrajectoryState:
    """A rule's run state, checkpointed with the engine (Python values only, so it resumes exactly)."""

    started: bool = False  # outer: the buffer holds an anchor; average: x has been set after warmup
    jump_due: bool = False  # the cycle just ended with a jump to make as the next step starts
    pending: bool = False  # a jump awaits its delayed verdict
    first_check: bool = False  # the next ordinary step checks the jump for divergence
    reference: float = math.nan  # the verification window's mean loss in the cycle before the jump
    spread: float = 0.0  # and its losses' standard deviation
    window: deque[float] = field(default_factory=deque)  # this cycle's last losses
    showing_average: bool = False  # average: validation sees x; the buffer holds the trained weights
    on_optimizer_sequence: bool = False  # average, within a step: the weights are z, awaiting the update

    def to_dict(self, anchor: Any) -> dict[str, Any]:
        return {
            "started": self.started,
            "jump_due": self.jump_due,
            "pending": self.pending,
            "first_check": self.first_check,
            "reference": self.reference,
            "spread": self.spread,
            "window": list(self.window),
            "anchor": anchor,
        }

    def load(self, state: dict[str, Any], window: int) -> None:
        self.started, self.pending = bool(state["started"]), bool(state["pending"])
        self.jump_due = bool(state.get("jump_due", False))  # checkpoints from before lazy jumps hold none
        self.first_check = bool(state["first_check"])
        self.reference, self.spread = float(state["reference"]), float(state["spread"])
        self.window = deque((float(v) for v in state["window"]), maxlen=window)


class TrajectoryCycle:
    """Trajectory rules' steps, jumps and verdicts; mixed into :class:`~.engine.HybridEngine`."""

    @property
    def rule(self) -> TrajectoryRule | None:
        predictor = self.parts.predictor if self.parts is not None else None
        return predictor if isinstance(predictor, TrajectoryRule) else None

    @property
    def verify_window(self) -> int:
        return self.parts.monitor.verify_window

    def _setup_rule(self, rule: TrajectoryRule, restored: bool) -> None:
        """Set the rule up on the store's tensors. Unless a checkpoint has just ``restored`` the run's state, the
        rule starts afresh: a new anchor or average at the next Full step."""
        verify = isinstance(rule, OuterMomentum) and self.verify_window > 0
        rule.setup(self.store.params, keep_jump=verify)
        if restored and self._pending_anchor is not None:
            self.store.load_buffer(self._pending_anchor)
        if not restored:
            self.traj = TrajectoryState()
        self._pending_anchor = None
        self.traj.window = deque(self.traj.window, maxlen=max(self.verify_window, 1))

    # -- per step ------------------------------------------------------------------------------------------------
    def _rule_begin_step(self, rule: TrajectoryRule) -> None:
        """A step starts: make the jump the last cycle decided on; or, at the first Full step, take the first
        anchor or start averaging at the current weights."""
        if self.traj.jump_due:
            self._jump(rule)
        if self.step.phase is not Phase.FULL or self.step.backed_off or self.traj.started:
            return
        if isinstance(rule, OuterMomentum):
            copy_(self.store.buffer, self.store.params)
        else:
            rule.restart(self.store.params)
        self.traj.started = True

    def _averaging(self) -> PrimalAverage | None:
        rule = self.rule
        step = self.step
        active = isinstance(rule, PrimalAverage) and self.traj.started and step.phase is Phase.FULL
        return rule if active and not step.backed_off else None

    def _rule_gradients_taken(self) -> None:
        """The backward pass is done (at ``y``): the optimizer's update goes to its own sequence ``z``. Inside
        ``optimizer.step(closure)``, after the closure; the optimizer's pre-step hook would be too early, since
        Lightning runs the closure inside ``step``."""
        rule = self._averaging()
        if rule is not None:
            rule.to_optimizer_sequence(self.store.params)
            self.traj.on_optimizer_sequence = True

    def _rule_after_update(self) -> None:
        if self.traj.on_optimizer_sequence:
            self.rule.to_gradient_point(self.store.params)
            self.traj.on_optimizer_sequence = False

    def _rule_step_ended(self) -> None:
        """A step whose update never ran (a gradient scaler skipped it): back to ``y``, with ``x`` unchanged."""
        if self.traj.on_optimizer_sequence:
            self.rule.back_to_gradient_point(self.store.params)
            self.traj.on_optimizer_sequence = False

    def _rule_observe(self, loss: float) -> None:
        """An ordinary step's loss, for the divergence statistics and the verification window."""
        self.parts.monitor.observe(loss, self.step.grad_norm)
        if self.traj.started and self.step.phase is Phase.FULL:
            self.traj.window.append(loss)

    def _check_after_jump(self, loss: float) -> bool:
        """The first ordinary step after a jump: roll it back at once if it diverged. Returns whether it did."""
        self.traj.first_check = False
        reason = self.parts.monitor.diverged(loss)
        if reason is None:
            return False
        self._reject_jump(reason)
        return True

    # -- the cycle's end -----------------------------------------------------------------------------------------
    def _rule_cycle_end(self, rule: TrajectoryRule) -> None:
        """A Full cycle is complete. ``outer``: judge the pending jump, then decide on the next one, made as the next
        step starts (after a rejected one, a cycle runs without, to measure the level afresh). ``average`` has no
        cycle."""
        if not isinstance(rule, OuterMomentum) or not self.traj.started:
            return
        traj, verify = self.traj, self.verify_window > 0
        mean = statistics.fmean(traj.window) if traj.window else math.nan
        spread = statistics.pstdev(traj.window) if len(traj.window) > 1 else 0.0
        traj.window.clear()
        if traj.pending:
            traj.pending = False
            pooled = math.sqrt((traj.spread**2 + spread**2) / 2)
            reason = self.parts.monitor.judge_window(traj.reference, mean, pooled)
            if reason is not None:
                self._reject_jump(reason)
                mean = math.nan  # measured with the rejected jump: no reference for the next one
            else:
                self.accept_segment()
        traj.reference, traj.spread = mean, spread
        off = self.policy.prediction_off or not self.config.enable_prediction or not rule.moves
        if off or (verify and (not math.isfinite(traj.reference) or not self._verdict_in_time())):
            copy_(self.store.buffer, self.store.params)  # no jump: the next cycle starts from here
            return
        traj.jump_due = True

    def _jump(self, rule: OuterMomentum) -> None:
        """Make the jump decided at the last cycle's end. It waits for the next step to start, so that whatever runs
        between steps (validation, checkpoints, the end of ``fit``) sees the weights the cycle trained, and a run
        that ends at a cycle's end hands those back. Parameters frozen or unfrozen in between: no jump."""
        traj, store = self.traj, self.store
        traj.jump_due = False
        if store.trainable_changed():
            copy_(store.buffer, store.params)  # the cycle's end will track the new set
            return
        rule.jump(store.params, store.buffer)
        self.collectives.parameters_changed()
        self.record.counters.segments_started += 1
        self.policy.segment_started()
        traj.pending = traj.first_check = self.verify_window > 0

    def _verdict_in_time(self) -> bool:
        """Whether a jump decided now would get its verdict (at the next cycle's end) before training ends. One that
        would not is not made: the last validation and the weights ``fit`` hands back are then the same, verified
        ones, instead of a jump that the end of ``fit`` would have to undo unjudged."""
        return self.last_step is None or self.global_step + self.config.full_steps <= self.last_step

    def _reject_jump(self, reason: str) -> None:
        rule = self.rule
        rule.undo(self.store.params, self.store.buffer)
        self.collectives.parameters_changed()
        traj = self.traj
        traj.pending = traj.first_check = False
        traj.reference = math.nan
        counters = self.record.counters
        counters.rollbacks += 1
        counters.predicted_steps_rolled_back += 1
        self._segment_failed()
        rank_zero_info(f"hybrid: rolled back an outer-momentum jump ({reason})")

    # -- what validation and the end of fit see ------------------------------------------------------------------
    def show_average(self) -> None:
        """Validation during ``fit``: the weights are the average; the trained ones wait in the buffer."""
        if isinstance(self.rule, PrimalAverage) and self.traj.started and not self.traj.showing_average:
            self.store.hold_params()
            copy_(self.store.params, self.rule.average)
            self.traj.showing_average = True
            self.collectives.parameters_changed()

    def hide_average(self) -> None:
        if self.traj.showing_average:
            copy_(self.store.params, self.store.buffer)
            self.store.release_buffer()
            self.traj.showing_average = False
            self.collectives.parameters_changed()

    def finish_average(self) -> None:
        """The end of ``fit``: the averaged sequence is the model ``fit`` hands back."""
        self.hide_average()
        if isinstance(self.rule, PrimalAverage) and self.traj.started:
            copy_(self.store.params, self.rule.average)
            self.collectives.parameters_changed()

    def averaged_parameters(self) -> list[tuple[Any, Any]]:
        """``(parameter, its average)`` pairs while ``average`` runs in ``fit`` (for checkpoints); empty otherwise
        (after ``fit`` the weights are the average)."""
        if not (isinstance(self.rule, PrimalAverage) and self.traj.started and self.store is not None):
            return []
        return list(zip(self.store.owners, self.rule.average))

    def _rule_state(self) -> dict[str, Any]:
        anchor = self._pending_anchor
        if isinstance(self.rule, OuterMomentum) and self.traj.started and self.store is not None:
            anchor = [t.detach().to("cpu", copy=True) for t in self.store.buffer]
        return self.traj.to_dict(anchor)

    def _load_rule_state(self, state: dict[str, Any]) -> None:
        """Checkpoints are restored before training starts; :meth:`_setup_rule` places the anchor then."""
        self.traj.load(state, max(self.verify_window, 1) if self.parts is not None else 1)
        anchor = state["anchor"]
        if self.store is not None and anchor is not None:
            self.store.load_buffer(anchor)
        else:
            self._pending_anchor, self._restored = anchor, True
