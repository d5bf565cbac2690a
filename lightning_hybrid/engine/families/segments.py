"""Per-step prediction (``linear``, ``mlp``, ``rssm``): ordinary steps teach the predictor how the weights move;
at a Full cycle's end a confident predictor plans a Predict segment, whose steps apply predicted updates with no
backward pass, watched by forward checks; the first Correct step verifies it, and a failed segment is rolled back
to its start."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.engine.families.observation import charge_bandit, teach
from lightning_hybrid.engine.families.segment_report import SegmentReport
from lightning_hybrid.engine.family import PredictionFamily, register_family
from lightning_hybrid.engine.phases import Due
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.outputs import loss_of, mark_predicted
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import Plan


@register_family
class PredictSegments(SegmentReport, PredictionFamily):
    """Capture each observed ordinary update, learn from it, and run Predict segments (see the module's doc)."""

    name = "segments"
    mode = "per-step"
    chooses_horizons = True
    predicts_steps = True
    uses_corrector = True

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.plan: Plan | None = None
        self.lr_ref: list[float] = []  # the learning rates of the last observed step: a plan's reference
        self.factors: list[float] = []  # the last plan's correction factors
        self.bandit_arm = 0  # the horizon the bandit chose last
        self._checking = False  # inside a predicted step that runs a forward check
        self._pending_snapshot: list[Tensor] | None = None  # from a checkpoint, until the store exists

    def setup(self, restored: bool) -> None:
        e = self.engine
        parts, store = e.parts, e.store
        parts.predictor.sum_across_ranks = e.collectives.sum_across_ranks
        parts.predictor.setup(store.groups, parts.encoder.dim)
        if parts.bandit is not None:
            parts.bandit.setup_arms(e.config.max_predict_steps, parts.encoder.dim)
        if self._pending_snapshot is not None:
            store.load_snapshot(self._pending_snapshot)
            self._pending_snapshot = None
        lrs = store.lrs()
        if len(lrs) != len(self.lr_ref):  # a new run, or groups came or went
            self.lr_ref = list(lrs)

    # -- ordinary steps ------------------------------------------------------------------------------------------
    def begin_step(self, step: StepRecord) -> bool:
        e = self.engine
        alive = e.store.snapshot_alive  # awaiting the verdict of the first Correct step
        sampled = e.global_step % e.config.observe_every == 0
        step.capture = step.phase.ordinary and not alive and not step.backed_off and sampled
        deferrable = not step.capture or e.parts.predictor.splits_observation
        return step.phase.ordinary and not alive and deferrable

    def judge(self, loss: float) -> bool:
        """The first Correct step: its loss, at the segment's final weights, verifies the segment."""
        e = self.engine
        if not e.store.snapshot_alive:
            return False
        reason = e.parts.monitor.check(loss, self.plan.loss_upper[-1])
        if reason is None:
            self._accept()
            return False
        self._rollback(reason)
        return True

    def track(self, step: StepRecord) -> Tensor | None:
        if not (step.delta_ready and isinstance(step.reading, tuple)):
            return None
        keep = 1.0 - step.reading[1]  # 0 when the guard skipped the update on the device
        return self.engine.parts.predictor.track(self.engine.store.buffer_groups, keep)

    def skip_tracked(self, tracked: Any) -> None:
        self.engine.parts.predictor.skip(tracked)  # folded in with weight zero

    def learn(self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: Any) -> float:
        predicted_loss = step.predicted_loss
        step.error = math.nan
        if step.phase.ordinary and not step.skipped and math.isfinite(step.loss):
            predicted_loss = teach(self.engine, step, global_step, lrs, tracked)
            self.lr_ref = lrs
        charge_bandit(self.engine, step, seconds)
        return predicted_loss

    # -- the cycle -----------------------------------------------------------------------------------------------
    def cycle_end(self) -> None:
        if not self._try_start_segment():
            self.engine.policy.decline(self.engine.global_step)

    def phase_done(self, due: Due) -> None:
        e = self.engine
        if due is Due.SEGMENT_END:
            e.store.restore_optimizer_state()
        elif due is Due.CORRECTION_END and e.parts.bandit is not None:
            e.parts.bandit.finish()

    @property
    def horizon(self) -> int:
        return self.plan.horizon if self.plan is not None else 0

    def _try_start_segment(self) -> bool:
        """Start a Predict segment if the predictor, its confidence and the bandit allow it."""
        e = self.engine
        parts, predictor = e.parts, e.parts.predictor
        if not predictor.ready:
            return False
        confidence, counters = predictor.confidence(), e.record.counters
        counters.confidence_peak = max(confidence, counters.confidence_peak or confidence)
        if confidence < e.config.confidence_threshold:
            return False
        features = parts.encoder.features()
        horizon = e.machine.horizon
        if parts.bandit is not None:
            arm = parts.bandit.choose(features)
            horizon = self.bandit_arm = parts.bandit.horizons[arm]
            if horizon == 0:  # the bandit prefers another Full cycle: that is the baseline, reward 0
                parts.bandit.update(arm, features, 0.0)
                return False
            _, slope, noise = parts.encoder.loss_trend()
            parts.bandit.begin(arm, features, slope, noise)
        plan, self.factors = parts.corrector.correct(predictor.plan(horizon, features), features, e.global_step)
        if not plan.fits(e.store.groups, predictor.directions(), e.collectives.sum_across_ranks):
            e.record.counters.invalid_plans += 1
            self._failed()
            return False
        e.store.take_snapshot()
        self.plan = plan
        e.record.counters.segments_started += 1
        parts.monitor.start_segment()
        e.policy.prediction_started()
        e.machine.start_segment()
        return True

    def _rollback(self, reason: str) -> None:
        """Put the weights (and the module's buffers) back where the segment started, and count the failure."""
        e = self.engine
        e.store.rollback()
        e.collectives.parameters_changed()
        counters = e.record.counters
        counters.rollbacks += 1
        counters.predicted_steps_rolled_back += e.machine.segment_pos
        self._failed()
        e.info(f"hybrid: rolled back a predicted segment after {e.machine.segment_pos} steps ({reason})")
        e.machine.enter(Phase.FULL)

    def _failed(self) -> None:
        e = self.engine
        if e.parts.bandit is not None:
            e.parts.bandit.abort()
        e.machine.segment_failed()
        e.count_failure()

    def _accept(self) -> None:
        e = self.engine
        e.store.release_snapshot()
        e.policy.prediction_accepted()
        e.machine.segment_accepted()
        e.record.counters.segments_accepted += 1

    # -- predicted steps -----------------------------------------------------------------------------------------
    def predicted_training_step(self, run: Callable[[], Any]) -> Any:
        """``training_step`` during Predict: a ``no_grad`` forward when one is due, otherwise none at all."""
        e = self.engine
        if e.automatic and not self._checking:
            # Lightning needs a loss (``None`` is refused under DDP): hand it the predicted one, marked.
            predicted = torch.tensor(self.plan.loss[e.machine.segment_pos], device=e.collectives.root_device)
            return mark_predicted(predicted)
        with torch.no_grad(), self._autocast():
            output = run()
        e.store.restore_module_buffers()  # the forward at predicted weights leaves no trace in them
        if e.automatic:
            e.step.forward_loss = loss_of(output)
        return mark_predicted(output)

    def _autocast(self) -> Any:
        if self.engine.config.predict_precision == "bf16":
            return torch.autocast(self.engine.collectives.root_device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def predict_step(self, closure: Callable[[], Any]) -> Any:
        """One predicted optimizer step: optional forward check, then the predicted update in place."""
        e = self.engine
        h, step = e.machine.segment_pos, e.step
        step.predicted_loss = self.plan.loss[h]
        step.band = self.plan.loss_upper[h] - self.plan.loss[h]
        every = e.config.predict_forward_every
        self._checking = every > 0 and h > 0 and h % every == 0
        try:
            with torch.no_grad():
                output = closure()
        finally:
            self._checking = False
        if step.forward_loss is not None:
            step.loss = e.step_guard.mean_over_ranks([step.forward_loss])[0]
            reason = e.parts.monitor.check(step.loss, self.plan.loss_upper[h])
            if reason is not None:
                self._rollback(reason)
                return output
            self.plan = e.parts.corrector.reanchor(self.plan, h, step.loss)
        if e.store.any_frozen():  # frozen mid-segment: no more predicted updates; the next step verifies
            e.machine.segment_pos = self.plan.horizon
            return output
        self._apply_prediction(h)
        e.machine.segment_pos += 1
        return output

    def _apply_prediction(self, h: int) -> None:
        """Predicted step ``h``: each group's direction times its planned scale, rescaled by how the group's
        learning rate has moved since the plan's reference."""
        e = self.engine
        lrs = e.store.lrs()
        ref, scales = self.lr_ref, self.plan.scales[h]
        alphas = [scales[g] * (lrs[g] / ref[g] if ref[g] > 0 else 0.0) for g in range(len(lrs))]
        e.store.add(e.parts.predictor.directions(), alphas)
        e.collectives.parameters_changed()

    # -- between steps -------------------------------------------------------------------------------------------
    @property
    def unverified(self) -> bool:
        e = self.engine
        return e.store is not None and e.store.snapshot_alive and e.machine.segment_pos > 0

    def end_fit(self) -> None:
        """A segment not yet verified is rolled back: no ordinary step is left to verify it. Then the predictor's
        parameter-sized state goes to the host."""
        e = self.engine
        if e.store.snapshot_alive:
            e.record.counters.end_of_fit_rollbacks += 1
            self._rollback("fit ended before the segment was verified")
        e.parts.predictor.release()

    # -- reporting and state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        store = self.engine.store
        return {
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "snapshot": store.snapshot() if store is not None else self._pending_snapshot,
            "lr_ref": list(self.lr_ref),
            "factors": list(self.factors),
            "bandit_arm": self.bandit_arm,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plan = Plan.from_dict(state["plan"]) if state["plan"] is not None else None
        self.lr_ref = [float(v) for v in state["lr_ref"]]
        self.factors, self.bandit_arm = [float(v) for v in state["factors"]], int(state["bandit_arm"])
        store = self.engine.store
        if store is None:
            self._pending_snapshot = state["snapshot"]
        elif state["snapshot"] is not None:
            store.load_snapshot(state["snapshot"])
        else:
            store.release_snapshot()

    @staticmethod
    def migrate_v1(state: dict[str, Any]) -> dict[str, Any]:
        """This family's part of a state version 1 checkpoint (one flat dictionary for the whole engine)."""
        if state.get("trajectory") is not None:
            raise ValueError("it was written by an outer run; resume it with predictor='outer'")
        return {key: state[key] for key in ("plan", "snapshot", "lr_ref", "factors", "bandit_arm")}
