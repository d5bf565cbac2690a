"""``outer`` jumps (the SNOO / one-worker DiLoCo outer-momentum rule): every backward pass is kept; each Full cycle
runs from an anchor, held in the store's buffer, and after it the weights jump along the cycle's displacement. A
jump is made as the next step starts, judged at that step for divergence, and then by the mean loss of the last
``verify_window`` steps of the cycle it starts; a rejected jump is subtracted again. Only the step after a jump is
read before its update; the others are quiet (guarded on the device where the optimizer allows, read per cycle).
Where a cycle's losses spread too widely against their level for that verdict to see harm (the rule's
``verify_resolution``), no jump is made. With the rule's ``alignment_window``, the jumps are also judged by whether
training carries them on or walks them back, and stop for the rest of the run once it walks them back; with its
``restart``, a cycle whose displacement points against the outer momentum resets it and makes no jump."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.families.jump_report import JumpReport, Readings
from lightning_hybrid.engine.families.jump_state import STATE_KEYS, JumpState
from lightning_hybrid.engine.family import PredictionFamily, register_family
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.engine.store import copy_
from lightning_hybrid.phase import Phase


@register_family
class OuterJumps(JumpReport, PredictionFamily):
    """Jumps of an :class:`~lightning_hybrid.predictors.OuterMomentum` rule, with their verdicts (see the module's
    doc). Holds the anchor in the store's buffer for the run."""

    name = "jumps"
    mode = "jumps"
    keeps_buffer = True
    gated = False  # every backward pass is kept: the regimes where per-step prediction failed do not apply
    phases = (Phase.WARMUP, Phase.FULL)
    failures = ("jumps undone", "jumps are")

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        engine.parts.predictor.follow_cycle(engine.config.full_steps)
        self.state = JumpState()
        self.readings = Readings()
        self._pending_anchor: list | None = None  # from a checkpoint, until the store exists

    @classmethod
    def check(cls, config: HybridConfig, parts: Components, sharded: bool) -> None:
        super().check(config, parts, sharded)
        window = parts.predictor.verify_window
        if window is not None and window > config.full_steps:
            raise ValueError(
                f"OuterMomentum: `verify_window` must be at most full_steps ({config.full_steps}): the window is the "
                f"end of the cycle after a jump; got {window}. Left unset, it is half the cycle."
            )

    @classmethod
    def first_judged_step(cls, config: HybridConfig, predictor: Any) -> int:
        """The first jump is decided at the end of the first Full cycle, and made only if its verdict, a cycle
        later, comes before training ends."""
        judged = config.full_steps if predictor.window_for(config.full_steps) > 0 else 0
        return config.warmup_steps + config.full_steps + judged

    @property
    def verify_window(self) -> int:
        """The verdict's window in steps: the rule's, or half the cycle."""
        return self.engine.parts.predictor.window

    def settings(self) -> dict[str, Any]:
        return super().settings() | {"verify_window": self.verify_window}  # the window it runs with

    def setup(self, restored: bool) -> None:
        """Unless a checkpoint has just restored the run's state, start afresh: a new anchor at the next Full step."""
        e, store = self.engine, self.engine.store
        e.parts.predictor.sum_across_ranks = e.collectives.sum_across_ranks if e.collectives.sharded else None
        rule = e.parts.predictor
        rule.setup(store.params, keep_jump=self.verify_window > 0 or self.alignment_window > 0)
        if rule.held_on_host and rule.state_on_host is None:
            e.info(
                "hybrid: the outer rule's momentum and the weights kept to undo its last jump would take more than "
                "half the device's free memory: they wait in host memory, moved in and out at each cycle's end "
                "(state_on_host=False keeps them on the device)"
            )
        if restored and self._pending_anchor is not None:
            store.load_buffer(self._pending_anchor)
        if not restored:
            self.state = JumpState()
        self._pending_anchor = None
        self.state.window = deque(self.state.window, maxlen=max(self.verify_window, 1))
        self.state.alignments = deque(self.state.alignments, maxlen=max(self.alignment_window, 1))

    @property
    def alignment_window(self) -> int:
        return self.engine.parts.predictor.alignment_window

    # -- per step ------------------------------------------------------------------------------------------------
    def begin_step(self, step: StepRecord) -> bool:
        """Make the jump the last cycle decided on; or, at the first Full step, take the first anchor. Every step
        may be quiet but the first after a jump, whose loss is judged before its update: the others' losses feed
        statistics and the verification window, which the engine fills in order before each cycle's end."""
        state, store = self.state, self.engine.store
        if state.jump_due:
            self._jump()
        if step.phase is Phase.FULL and not step.backed_off and not state.started:
            copy_(store.buffer, store.params)
            state.started = True
        return not state.first_check

    def judge(self, loss: float) -> bool:
        """The first ordinary step after a jump: undo it at once if it diverged (the step's own update, computed at
        the rejected point, is skipped)."""
        if not self.state.first_check:
            return False
        self.state.first_check = False
        reason = self.engine.parts.monitor.diverged(loss)
        if reason is None:
            return False
        self._reject(reason)
        return True

    def learn(self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: Any) -> float:
        """An ordinary step's loss feeds the divergence statistics and the verification window. The first cycle's
        learning rates are its first step's, as the step ends (where both doors see the same ones)."""
        if self.state.started and self.state.cycle_lrs is None:
            self.state.cycle_lrs = lrs
        if step.phase.ordinary and not step.skipped and math.isfinite(step.loss):
            self.engine.parts.monitor.observe(step.loss, step.grad_norm)
            if self.state.started and step.phase is Phase.FULL:
                self.state.window.append(step.loss)
        return step.predicted_loss

    # -- the cycle's end -----------------------------------------------------------------------------------------
    def cycle_end(self) -> None:
        """Judge the pending jump, then decide on the next one, made as the next step starts (after a rejected
        one, a cycle runs without, to measure the level afresh)."""
        state, e = self.state, self.engine
        if not state.started:
            return
        if state.aligning:
            self._judge_alignment()
        verify = self.verify_window > 0
        mean = statistics.fmean(state.window) if state.window else math.nan
        spread = statistics.pstdev(state.window) if len(state.window) > 1 else 0.0
        state.window.clear()
        if state.pending:
            state.pending = False
            pooled = math.sqrt((state.spread**2 + spread**2) / 2)
            margin = e.parts.predictor.tolerance(pooled)
            self.readings.verdict = (state.reference, mean, margin)
            reason = e.parts.monitor.judge_window(state.reference, mean, margin)
            if reason is not None:
                self._reject(reason)
                mean = math.nan  # measured with the rejected jump: no reference for the next one
            else:
                e.policy.prediction_accepted()
                e.record.counters.jumps_kept += 1
        state.reference, state.spread = mean, spread
        if verify and math.isfinite(mean) and mean != 0:
            self.readings.cycle_margin = e.parts.predictor.tolerance(spread) / abs(mean)
        rising = self._lr_rose()
        off = e.policy.prediction_off or not e.config.enable_prediction or not e.parts.predictor.moves
        off = off or state.stopped_at >= 0 or rising
        unjudged = verify and (not math.isfinite(state.reference) or not self._verdict_in_time())
        if off or unjudged or self._blind():
            copy_(e.store.buffer, e.store.params)  # no jump: the next cycle starts from here
            e.parts.predictor.put_away()
            return
        state.jump_due = True  # what the rule brought to the device stays there for it

    def _jump(self) -> None:
        """Make the jump decided at the last cycle's end. It waits for the next step to start, so that whatever runs
        between steps (validation, checkpoints, the end of ``fit``) sees the weights the cycle trained, and a run
        that ends at a cycle's end hands those back. Parameters frozen or unfrozen in between: no jump."""
        e, state = self.engine, self.state
        if e.store.trainable_changed():
            state.jump_due = False
            copy_(e.store.buffer, e.store.params)  # the cycle's end will track the new set
            return
        jumped = e.parts.predictor.jump(e.store.params, e.store.buffer, measure=e.logs)  # raising, it stays due
        state.jump_due = False
        if jumped.restart:  # the cycle pointed against the outer momentum, which restarted: no jump
            e.record.counters.jump_restarts += 1
            copy_(e.store.buffer, e.store.params)
            return
        e.store.buffer_replaced()  # the anchor is now the tensors the jump landed in
        self.readings.size = jumped.size  # over ranks
        e.collectives.parameters_changed()
        e.record.counters.jumps_made += 1
        e.policy.prediction_started()
        state.pending = state.first_check = self.verify_window > 0
        state.aligning = self.alignment_window > 0

    def _lr_rose(self) -> bool:
        """Whether a group's learning rate rose over the cycle that just ended (a warm-up, or a cyclic schedule's
        rise): no jump then, since jumping along a rising rate's steps cost the char GPT about 2% of its backward
        passes to plain's loss (3 seeds, a warm-up of a quarter of the run). Counted, and said the first time."""
        state, e = self.state, self.engine
        lrs = e.store.lrs()
        rose = state.cycle_lrs is not None and any(now > then for now, then in zip(lrs, state.cycle_lrs))
        state.cycle_lrs = lrs
        if rose:
            e.record.counters.rising_lr_cycles += 1
            if e.record.counters.rising_lr_cycles == 1:
                e.info("hybrid: no jump while the learning rate rises (a warm-up): jumps start once it stops rising")
        return rose

    def _blind(self) -> bool:
        """Whether this cycle's losses spread too widely, against their level, for the delayed verdict to see a
        jump's harm (the rule's ``verify_resolution``): then no jump is made, and it is counted."""
        state, e = self.state, self.engine
        if not e.parts.predictor.blind(state.reference, state.spread):
            return False
        e.record.counters.jumps_blind += 1
        return True

    def _judge_alignment(self) -> None:
        """The cycle after a jump has ended: record the jump's alignment with it (see
        :class:`~lightning_hybrid.predictors.OuterMomentum`); stop jumping once the mean over the window is <= 0."""
        e, state = self.engine, self.state
        state.aligning = False
        dot, moved_sq, jump_sq = e.collectives.sum_across_ranks(
            e.parts.predictor.alignment_terms(e.store.params, e.store.buffer)
        ).tolist()
        cosine = dot / math.sqrt(jump_sq * moved_sq) if jump_sq > 0 and moved_sq > 0 else 0.0
        state.alignments.append(cosine)
        mean = statistics.fmean(state.alignments)
        if len(state.alignments) == self.alignment_window and mean <= 0 and state.stopped_at < 0:
            state.stopped_at = e.global_step
            e.info(
                f"hybrid: outer-momentum jumps stopped at step {e.global_step}: training walked the last "
                f"{self.alignment_window} back (mean alignment {mean:+.3f})"
            )

    def _verdict_in_time(self) -> bool:
        """Whether a jump decided now would get its verdict (at the next cycle's end) before training ends. One that
        would not is not made: the last validation and the weights ``fit`` hands back are then the same, verified
        ones, instead of a jump that the end of ``fit`` would have to undo unjudged."""
        e = self.engine
        return e.last_step is None or e.global_step + e.config.full_steps <= e.last_step

    def _reject(self, reason: str) -> None:
        e, state = self.engine, self.state
        e.parts.predictor.undo(e.store.params, e.store.buffer)
        e.collectives.parameters_changed()
        state.pending = state.first_check = state.aligning = False
        state.reference = math.nan
        counters = e.record.counters
        counters.rollbacks += 1
        counters.jumps_rejected += 1
        e.count_failure()  # an undo is the verdict at work, not news: the summary counts each by reason

    # -- between steps -------------------------------------------------------------------------------------------
    @property
    def unverified(self) -> bool:
        return self.state.pending

    def end_fit(self) -> None:
        if self.state.pending:
            self.engine.record.counters.end_of_fit_rollbacks += 1
            self._reject("fit ended before the jump was verified")
        self.engine.parts.predictor.release()

    # -- reporting and state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state, store = self.state, self.engine.store
        anchor = self._pending_anchor
        if state.started and store is not None:
            anchor = [t.detach().to("cpu", copy=True) for t in store.buffer]
        return {**state.to_dict(), "anchor": anchor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Checkpoints are restored before training starts; :meth:`setup` places the anchor then."""
        parts = self.engine.parts is not None
        window = max(self.verify_window, 1) if parts else 1
        aligned = max(self.alignment_window, 1) if parts else 1
        self.state = JumpState.from_dict(state, window, aligned)
        store, anchor = self.engine.store, state["anchor"]
        if store is not None and anchor is not None:
            store.load_buffer(anchor)
        else:
            self._pending_anchor = anchor

    @staticmethod
    def migrate_v1(state: dict[str, Any]) -> dict[str, Any]:
        trajectory = state.get("trajectory")
        if trajectory is None:
            raise ValueError("it was written by a per-step predictor's run; resume it with that predictor")
        return {"jump_due": False, **{k: trajectory[k] for k in STATE_KEYS if k in trajectory}}
