"""HybridEngine: one optimizer step at a time, through the parts that decide what the step does.

A step flows through the files of this package in order: :mod:`~.policy` says whether it observes,
:mod:`~.guard` reads and guards an ordinary step, :mod:`~.store` captures its update or applies a predicted one,
:mod:`~.phases` moves the cycle on, and :mod:`~.record` counts and reports it. The engine owns no Lightning
object: a hybrid strategy hands it the step (:class:`~.interface.StepHandler`), the ``HybridScheduler`` callback
calls :meth:`begin_step`/:meth:`end_step` from Lightning's hooks and checkpoints :meth:`state_dict`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.guard import Reading, StepGuard
from lightning_hybrid.engine.interface import Collectives
from lightning_hybrid.engine.learning import Learning
from lightning_hybrid.engine.phases import Due, PhaseMachine
from lightning_hybrid.engine.policy import PredictionPolicy
from lightning_hybrid.engine.record import Deferred, RunRecord, StepRecord
from lightning_hybrid.engine.segments import SegmentCycle
from lightning_hybrid.engine.state import EngineState
from lightning_hybrid.engine.store import ParameterStore
from lightning_hybrid.engine.trajectory import TrajectoryCycle, TrajectoryState
from lightning_hybrid.outputs import loss_of, mark_predicted
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import Plan
from lightning_hybrid.predictors.rules import OuterMomentum


def _read(values: Tensor | list | None, flat: Iterator[float]) -> list | None:
    """``values``, a tensor whose numbers come next in ``flat``, as (nested) lists; anything else unchanged."""
    if not isinstance(values, Tensor):
        return values
    taken = [next(flat) for _ in range(values.numel())]
    return torch.tensor(taken, dtype=torch.float64).view(values.shape).tolist() if values.dim() > 1 else taken


class HybridEngine(Learning, SegmentCycle, TrajectoryCycle, EngineState):
    """The Warmup → Full → Predict → Correct cycle over one optimizer, without a Trainer.

    Build it with the config, :meth:`connect` the components, :meth:`bind` the optimizer, then per optimizer step
    call :meth:`begin_step`, route the step through the :class:`~.interface.StepHandler` methods (or call the
    optimizer's step between them), and :meth:`end_step`.
    """

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        self.machine = PhaseMachine(
            config.warmup_steps, config.full_steps, config.correction_steps, config.max_predict_steps
        )
        self.policy = PredictionPolicy(config)
        self.record = RunRecord()
        self.step = StepRecord(phase=self.machine.phase)
        self.parts: Components | None = None
        self.store: ParameterStore | None = None
        self.step_guard: StepGuard | None = None
        self.collectives: Collectives | None = None
        self.plan: Plan | None = None
        self.lr_ref: list[float] = []
        self.automatic = True
        self.global_step = 0
        self.last_step: int | None = None  # where training will end, if known
        self.world_size = 1
        self._pending_snapshot: list[Tensor] | None = None  # from a checkpoint, until the store exists
        self.traj = TrajectoryState()  # a trajectory rule's run state
        self._pending_anchor: list[Tensor] | None = None  # an outer-momentum anchor from a checkpoint
        self._restored = False  # a checkpoint was loaded since the last bind
        self.deferred: list[Deferred] = []  # quiet steps not read yet, oldest first

    # -- wiring --------------------------------------------------------------------------------------------------
    def connect(self, parts: Components) -> None:
        self.parts = parts

    def bind(
        self,
        optimizer: Optimizer,
        collectives: Collectives,
        *,
        automatic: bool = True,
        scaler: Any = None,
        global_step: int = 0,
        world_size: int = 1,
        buffers: Sequence[Tensor] = (),
        last_step: int | None = None,
    ) -> None:
        """Training starts: take this optimizer's trainable parameters (and the module's ``buffers``, which a
        rollback restores) and set the predictor up on them. ``last_step``: the global step at which training
        will end, where known, so that no jump is made that the run cannot verify."""
        self.collectives = collectives
        self.step_guard = StepGuard(collectives, scaler)
        self._build_store(optimizer, buffers, restored=self._restored)
        self._restored = False
        if self._pending_snapshot is not None:
            self.store.load_snapshot(self._pending_snapshot)
            self._pending_snapshot = None
        lrs = self.store.lrs()
        if not self.lr_ref:
            self.lr_ref = lrs
        self.policy.start(lrs, gated=self.rule is None)
        self.automatic = automatic
        self.global_step, self.world_size, self.last_step = global_step, world_size, last_step
        self.record.start_clock()
        self.step = StepRecord(phase=self.machine.phase)

    def _build_store(self, optimizer: Optimizer, buffers: Sequence[Tensor], restored: bool = False) -> None:
        """Track the parameters the optimizer trains now, and set the predictor (and bandit), or the trajectory
        rule, up on them."""
        collectives, parts = self.collectives, self.parts
        keep = isinstance(self.rule, OuterMomentum) or self.config.capture_buffer == "kept"  # outer's anchor
        self.store = ParameterStore(optimizer, collectives.local_tensor, self.config.predict_memory, buffers, keep)
        if self.rule is not None:
            self._setup_rule(self.rule, restored)
            return
        parts.predictor.sum_across_ranks = collectives.sum_across_ranks
        parts.predictor.setup(self.store.groups, parts.encoder.dim)
        if parts.bandit is not None:
            parts.bandit.setup_arms(self.config.max_predict_steps, parts.encoder.dim)

    def close_segment(self) -> None:
        """Training ends: a segment not yet verified is rolled back, so ``fit`` never hands back unverified weights
        (no ordinary step is left to verify them). Quiet steps not read yet are read."""
        self.read_deferred()
        if self.store is not None and self.store.snapshot_alive:
            self.record.counters.end_of_fit_rollbacks += 1
            self.rollback("fit ended before the segment was verified")
        elif self.store is not None and self.traj.pending:
            self.record.counters.end_of_fit_rollbacks += 1
            self._reject_jump("fit ended before the jump was verified")

    def unbind(self) -> None:
        if self.store is not None:
            self.store.close()
        self.store = self.step_guard = self.collectives = None

    @property
    def phase(self) -> Phase:
        return self.machine.phase

    @property
    def predicting(self) -> bool:
        return self.machine.predicting

    # -- one step ------------------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        phase, store = self.machine.phase, self.store
        backed_off = phase.ordinary and self.policy.backed_off(self.global_step, store.lrs())
        rule = self.rule
        sampled = self.global_step % self.config.observe_every == 0
        capture = phase.ordinary and not store.snapshot_alive and not backed_off and rule is None and sampled
        # nothing to verify, and what there is to learn can wait: guarded on the device, read later
        deferrable = not capture or self.parts.predictor.splits_observation
        quiet = phase.ordinary and rule is None and not store.snapshot_alive and deferrable
        quiet = quiet and self.step_guard.skips_on_device(store.optimizer)
        if not quiet:
            self.read_deferred()
        self.step = StepRecord(
            phase=phase, started=time.perf_counter(), backed_off=backed_off, capture=capture, quiet=quiet
        )
        if rule is not None:
            self._rule_begin_step(rule)

    def before_optimizer_step(self) -> None:
        if self.step.capture:
            self.store.before_update()

    def after_optimizer_step(self) -> None:
        if self.step.quiet:
            self.step_guard.step_done(self.store.optimizer)
        if self.step.capture:
            self.store.after_update()
            self.step.delta_ready = True
        elif self.rule is not None:
            self._rule_after_update()

    def end_step(self, global_step: int) -> float:
        """The optimizer has stepped: learn from the step and move the cycle on. Returns the loss the predictor
        expected for this step (``nan`` where it had none), for the step's scalars."""
        self.global_step = global_step
        lrs = self.store.lrs()
        self.policy.track_peak(lrs)
        step = self.step
        seconds = time.perf_counter() - step.started
        self.record.count_step(step, seconds)
        if step.quiet:
            entry = Deferred(step, global_step, seconds, lrs)
            if step.delta_ready and isinstance(step.reading, Tensor):  # fold the update in now, learn later
                keep = 1.0 - step.reading[2:].amax()  # 0 when the guard skipped the update on the device
                entry.tracked = self.parts.predictor.track(self.store.buffer_groups, keep)
            self.deferred.append(entry)
            if len(self.deferred) >= self.config.full_steps:  # once per cycle: the outlier limit stays recent
                self.read_deferred()
            self._advance()
            return math.nan
        if self.rule is not None:
            self._rule_step_ended()
        predicted_loss = self._learn_from(step, global_step, lrs, seconds)
        self._advance()
        return predicted_loss

    def read_deferred(self) -> None:
        """Read the quiet steps' values to the host at once (one transfer, not one per step) and learn from each
        step in order, exactly as if it had been read when it ran."""
        pending, self.deferred = self.deferred, []
        on_device = [t for d in pending for t in (d.step.reading, d.tracked) if isinstance(t, Tensor)]
        if on_device:  # one transfer for all of them
            flat = iter(torch.cat([t.flatten() for t in on_device]).tolist())
            for d in pending:
                d.step.reading, d.tracked = _read(d.step.reading, flat), _read(d.tracked, flat)
        counters = self.record.counters
        for entry in pending:
            step = entry.step
            if step.reading is not None:
                step.loss, step.grad_norm, nonfinite, outlier = step.reading
                step.skipped, step.reading = bool(nonfinite or outlier), None
                counters.nonfinite_steps_skipped += int(bool(nonfinite))
                counters.outlier_steps_skipped += int(bool(outlier and not nonfinite))
            else:
                step.skipped = True  # the user's training_step skipped the batch
            if step.skipped and entry.tracked is not None:
                self.parts.predictor.skip(entry.tracked)  # folded in with weight zero
            self._learn_from(step, entry.global_step, entry.lrs, entry.seconds, entry.tracked)

    def _advance(self) -> None:
        horizon = self.plan.horizon if self.plan is not None else 0
        due = self.machine.step_done(self.step.phase, self.step.backed_off, horizon)
        if due is not None:
            self.read_deferred()  # the decisions below read what the components learnt
        if due is Due.CYCLE_END and self.rule is not None:
            if not self._follow_trainable_set():
                self._rule_cycle_end(self.rule)
        elif due is Due.CYCLE_END and not self._follow_trainable_set() and not self._try_start_segment():
            self.policy.decline(self.global_step)
        elif due is Due.SEGMENT_END:
            self.store.restore_optimizer_state()
        elif due is Due.CORRECTION_END and self.parts.bandit is not None:
            self.parts.bandit.finish()
        self.store.release_buffer()  # the step's update has been read; a segment that started holds its snapshot

    # -- StepHandler: what the strategy routes through the engine --------------------------------------------------
    def predicted_training_step(self, run: Callable[[], Any]) -> Any:
        """``training_step`` during Predict: a ``no_grad`` forward when one is due, otherwise none at all."""
        if self.automatic and not self.step.forward_now:
            # Lightning needs a loss (``None`` is refused under DDP): hand it the predicted one, marked.
            predicted = torch.tensor(self.plan.loss[self.machine.segment_pos], device=self.collectives.root_device)
            return mark_predicted(predicted)
        with torch.no_grad(), self._predict_autocast():
            output = run()
        self.store.restore_module_buffers()  # the forward at predicted weights leaves no trace in them
        if self.automatic:
            self.step.forward_loss = loss_of(output)
        return mark_predicted(output)

    def _predict_autocast(self) -> Any:
        if self.config.predict_precision == "bf16":
            return torch.autocast(self.collectives.root_device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def record_loss(self, loss: Tensor) -> None:
        """Loss passed to ``backward`` (summed over accumulated micro-batches)."""
        loss, step = loss.detach().float(), self.step
        if self.predicting:
            if not self.automatic:  # automatic Predict steps record their loss in `predicted_training_step`
                step.forward_loss = loss if step.forward_loss is None else step.forward_loss + loss
        else:
            step.loss_sum = loss if step.loss_sum is None else step.loss_sum + loss
            self.record.counters.backward_passes += 1

    def guard(self, optimizer: Optimizer, closure: Callable[[], Any]) -> Callable[[], Any]:
        """Wrap an ordinary step's closure so a non-finite loss or gradient never reaches the weights."""

        def guarded() -> Any:
            output = closure()
            self.store.wait_for_optimizer_state()  # copied back after a segment: the update reads it next
            self._check_ordinary_step(optimizer)
            if self.rule is not None:
                self._rule_gradients_taken()  # after the backward, before the update
            return output

        return guarded

    def predict_step(self, closure: Callable[[], Any]) -> Any:
        """One predicted optimizer step: optional forward check, then the predicted update in place."""
        h, step = self.machine.segment_pos, self.step
        step.predicted_loss = self.plan.loss[h]
        step.band = self.plan.loss_upper[h] - self.plan.loss[h]
        every = self.config.predict_forward_every
        step.forward_now = every > 0 and h > 0 and h % every == 0
        try:
            with torch.no_grad():
                output = closure()
        finally:
            step.forward_now = False
        if step.forward_loss is not None:
            step.loss = self.step_guard.mean_over_ranks([step.forward_loss])[0]
            reason = self.parts.monitor.check(step.loss, self.plan.loss_upper[h])
            if reason is not None:
                self.rollback(reason)
                return output
            self.plan = self.parts.corrector.reanchor(self.plan, h, step.loss)
        if self.store.any_frozen():  # frozen mid-segment: no more predicted updates; the next step verifies
            self.machine.segment_pos = self.plan.horizon
            return output
        self._apply_prediction(h)
        self.machine.segment_pos += 1
        return output

    def _check_ordinary_step(self, optimizer: Optimizer) -> None:
        step = self.step
        if step.quiet:
            limit = self.parts.monitor.outlier_limit()
            step.reading = self.step_guard.check_on_device(optimizer, self.store.owners, step.loss_sum, limit)
            return
        reading = self.step_guard.read(self.store.owners, step.loss_sum)
        if reading is None:
            step.skipped = True  # the user's training_step skipped this batch
            return
        step.loss, step.grad_norm = reading.loss, reading.grad_norm
        if self.traj.first_check and self._check_after_jump(reading.loss if reading.finite else math.nan):
            self._skip(optimizer, reading)  # its gradient was taken at the rejected point
            return
        if self.store.snapshot_alive:  # first Correct step: the loss at the segment's final weights verifies it
            reason = self.parts.monitor.check(reading.loss if reading.finite else math.nan, self.plan.loss_upper[-1])
            if reason is not None:
                self._skip(optimizer, reading)
                self.rollback(reason)
                return
            self.accept_segment()
        if not reading.finite:
            self._skip(optimizer, reading)
            self.record.counters.nonfinite_steps_skipped += 1
        elif self.parts.monitor.gradient_outlier(reading.grad_norm):
            self._skip(optimizer, reading)
            self.record.counters.outlier_steps_skipped += 1

    def _skip(self, optimizer: Optimizer, reading: Reading) -> None:
        self.step.skipped = True
        self.step_guard.skip(optimizer, reading.grads)

    # -- reporting and state -------------------------------------------------------------------------------------
    def metrics(self, predicted_loss: float) -> dict[str, float]:
        """The ``hybrid/*`` scalars of the step just ended (a quiet step's are read now)."""
        self.read_deferred()
        predictor = self.parts.predictor
        horizon = self.plan.horizon if self.plan is not None else 0
        return self.record.metrics(
            self.step,
            predicted_loss,
            horizon,
            predictor.confidence(),
            predictor.uncertainty(),
            self.parts.bandit is not None,
        )

    def summary(self) -> dict[str, Any]:
        """Whole-run numbers, as written to ``hybrid_summary.json``."""
        self.read_deferred()
        parts = self.parts
        out = self.record.summary()
        counters = self.record.counters
        out["rollback_reasons"] = {
            **parts.monitor.events,
            "invalid_plan": counters.invalid_plans,
            "end_of_fit": counters.end_of_fit_rollbacks,
        }
        out["prediction_disabled"] = self.policy.prediction_off
        out["predictor"] = parts.predictor.name
        if parts.bandit is not None:
            out["arm_counts"] = {str(arm): n for arm, n in zip(parts.bandit.arms, parts.bandit.counts)}
        out["final_confidence"] = parts.predictor.confidence()
        out["config"] = self.config.to_dict()
        if self.rule is not None:
            out["trajectory_rule"] = self.rule.name  # segments are outer's jumps; average makes none
        return out
