"""HybridEngine: one optimizer step at a time, through the parts that decide what it does: :mod:`~.policy` (observe
or back off), :mod:`~.guard` (read and guard an ordinary step), :mod:`~.store` (the tensors), :mod:`~.phases` (the
cycle) and :mod:`~.record` (counts); prediction around the steps is the :class:`~.family.PredictionFamily`'s. It owns
no Lightning object: the scheduler calls it from Lightning's hooks (an ordinary step's loss from
``on_before_backward``, its guard from ``on_before_optimizer_step``), a hybrid strategy hands it the predicted steps
(:class:`~.step_route.StepRoute`), and a loop of one's own (:class:`~lightning_hybrid.loop.HybridLoop`) makes the
same calls from torch's optimizer hooks and its ``record_loss``."""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor
from torch.optim import Optimizer

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.deferred import Deferred, read_all
from lightning_hybrid.engine.families import family_of
from lightning_hybrid.engine.family import PredictionFamily
from lightning_hybrid.engine.guard import StepGuard, skip_message
from lightning_hybrid.engine.interface import Collectives
from lightning_hybrid.engine.phases import Due, PhaseMachine
from lightning_hybrid.engine.policy import PredictionPolicy
from lightning_hybrid.engine.record import RunRecord, StepRecord
from lightning_hybrid.engine.state import engine_state, load_engine_state
from lightning_hybrid.engine.step_route import StepRoute
from lightning_hybrid.engine.store import ParameterStore
from lightning_hybrid.phase import Phase

log = logging.getLogger("lightning_hybrid")


class HybridEngine:
    """The Warmup → Full → Predict → Correct cycle over one optimizer, without a Trainer.

    Build it with the config (and, optionally, where messages go), :meth:`connect` the components (their
    predictor names the family that runs it), :meth:`bind` the optimizer, then per optimizer step call
    :meth:`begin_step`, run the step (:meth:`record_loss` for each backward pass, :meth:`guard_step` after the last,
    :meth:`drop_skipped` before the update; or route it whole through ``route``, a :class:`~.step_route.StepRoute`,
    which calls them), and :meth:`end_step`.
    """

    def __init__(
        self, config: HybridConfig, info: Callable[[str], Any] = log.info, warn: Callable[[str], Any] = warnings.warn
    ) -> None:
        self.config = config
        phases = (config.warmup_steps, config.full_steps, config.correction_steps, config.max_predict_steps)
        self.machine = PhaseMachine(*phases)
        self.policy = PredictionPolicy(config)
        self.record = RunRecord()
        self.step = StepRecord(phase=self.machine.phase)
        self.parts: Components | None = None
        self.family: PredictionFamily | None = None
        self.store: ParameterStore | None = None
        self.step_guard: StepGuard | None = None
        self.collectives: Collectives | None = None
        self.automatic, self.global_step, self.world_size = True, 0, 1
        self.last_step: int | None = None  # where training will end, if known
        self.deferred: list[Deferred] = []  # quiet steps not read yet, oldest first
        self.skips_on_device = False  # the bound optimizer's update can be skipped on the device (a quiet step)
        self._restored = False  # a checkpoint was loaded since the last bind
        self.stepped_aside: str | None = None  # where and why the engine left a fit to Lightning
        self.logs = True  # the step's scalars are logged: readings that only they show are worth taking
        self.decided = False  # the step just ended brought a decision (a cycle's end): what the bar shows changed
        self.info, self._warn = info, warn
        self.route = StepRoute(self)  # the StepHandler a hybrid strategy routes its predicted steps through

    # -- wiring --------------------------------------------------------------------------------------------------
    @property
    def bound(self) -> bool:
        return self.store is not None

    def connect(self, parts: Components) -> None:
        self.parts = parts
        self.family = family_of(parts.predictor)(self)

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
        logs: bool = True,
    ) -> None:
        """Training starts: take this optimizer's trainable parameters (and the module's ``buffers``, which a
        rollback restores) and set the family up on them. ``last_step``: the global step at which training will
        end, where known, so that no prediction is made that the run cannot verify; ``logs``: whether the step's
        scalars are logged (readings only they show are taken only then)."""
        self.collectives = collectives
        unscales = bool(getattr(optimizer, "_step_supports_amp_scaling", False))  # a fused step, a scaler's too
        self.step_guard = StepGuard(collectives, scaler, world_size, grads_scaled=unscales)
        self.skips_on_device = self.step_guard.skips_on_device(optimizer)
        self.automatic = automatic
        self.global_step, self.world_size, self.last_step, self.logs = global_step, world_size, last_step, logs
        self._build_store(optimizer, buffers)
        self.family.setup(restored=self._restored)
        self._restored = False
        self.policy.start(self.store.lrs(), gated=self.family.gated)
        self.record.start_clock(global_step)
        self.step = StepRecord(phase=self.machine.phase)
        self._said_skip = False  # this fit has said that the guard skipped a step

    def _build_store(self, optimizer: Optimizer, buffers: Sequence[Tensor]) -> None:
        keep = self.family.keeps_buffer or self.config.capture_buffer == "kept"
        local = self.collectives.local_tensor
        self.store = ParameterStore(optimizer, local, self.config.predict_memory, buffers, keep)

    def _follow_trainable_set(self) -> bool:
        """At a Full cycle's end, before any decision: if parameters were frozen, unfrozen or added since the last
        check, track the new set from the next cycle (a new store, the family set up afresh on its tensors).
        Returns whether it changed."""
        if not self.store.trainable_changed():
            return False
        self._build_store(self.store.optimizer, self.store.module_buffers)
        lrs = self.store.lrs()
        if len(lrs) != len(self.policy.lr_peak):  # groups came or went: the learning-rate peaks start again
            self.policy.lr_peak = list(lrs)
        self.family.setup(restored=False)
        return True

    def end_fit(self) -> None:  # training ends, however: quiet steps read, anything unverified undone by the family
        self.read_deferred()
        if self.store is not None:
            self.family.end_fit()

    def step_aside(self, reason: str) -> None:
        """Stop for the rest of the fit, which trains plainly: anything unverified undone, the summary says why."""
        self.end_fit()
        self.record.stop_clock()
        self.stepped_aside = f"at step {self.global_step}: {reason}"
        self.unbind()

    def unbind(self) -> None:
        if self.store is not None:
            self.store.close()
        self.store = self.step_guard = self.collectives = None

    # -- services the families use (and ``info``, where messages go) ---------------------------------------------
    def count_failure(self) -> None:
        if self.policy.prediction_failed():
            failed, what = self.family.failures
            self._warn(
                f"hybrid: {self.policy.consecutive_failures} {failed} in a row; {what} off for the rest of this run, "
                "which continues as plain training."
            )

    @property
    def phase(self) -> Phase:
        return self.machine.phase

    @property
    def predicting(self) -> bool:
        return self.machine.predicting

    @property
    def unverified(self) -> bool:
        """Whether the weights now hold a prediction that no verdict has kept yet."""
        return self.family is not None and self.family.unverified

    def evaluate(self, on: bool) -> bool:
        """Put in the parameters what the run is evaluated at, or take it out (the family's); whether they changed."""
        return self.bound and self.family.evaluate(on)

    @property
    def evaluating(self) -> bool:  # the parameters hold what the run is evaluated at, not what it trains
        return self.bound and self.family.evaluating

    def evaluated_weights(self) -> list[Tensor] | None:  # a checkpoint's weights where the parameters differ
        return self.family.evaluated_weights() if self.bound else None

    # -- one step ------------------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        phase, store = self.machine.phase, self.store
        backed_off = self.policy.backed_off(self.global_step, store.lrs) if phase.ordinary else None
        self.step = step = StepRecord(phase=phase, backed_off=backed_off)
        # quiet: nothing to verify, and what there is to learn can wait: guarded on the device, read later
        step.quiet = self.family.begin_step(step) and self.skips_on_device
        if not step.quiet and self.deferred:
            self.read_deferred()
        step.started = time.perf_counter()

    def before_optimizer_step(self) -> None:
        if self.step.capture:  # the family asked for this step's update: the store's buffer holds new - old
            self.store.before_update()

    def after_optimizer_step(self, optimizer: Optimizer) -> None:
        """``optimizer`` has stepped (one of several, with an :class:`~.optimizers.OptimizerSet`)."""
        step = self.step
        if step.quiet:
            self.step_guard.step_done(optimizer)
        if step.capture:
            self.store.after_update()
            step.delta_ready = True

    def end_step(self, global_step: int) -> float:
        """The optimizer has stepped: learn from the step and move the cycle on. Returns the loss the family
        expected for this step (``nan`` where it had none), for the step's scalars."""
        self.global_step = global_step
        lrs = self.store.lrs()
        self.policy.track_peak(lrs)
        step = self.step
        seconds = time.perf_counter() - step.started
        self.record.count_step(step, seconds)
        predicted_loss = math.nan
        if step.quiet:  # fold what must be taken now in, learn later
            self.deferred.append(Deferred(step, global_step, seconds, lrs, self.family.track(step)))
            if len(self.deferred) >= self.config.full_steps:  # once per cycle: the outlier limit stays recent
                self.read_deferred()
        else:
            predicted_loss = self.family.learn(step, global_step, lrs, seconds, None)
        self._advance()
        return predicted_loss

    def read_deferred(self) -> None:
        """Read the quiet steps' values to the host at once (one transfer, not one per step) and learn from each
        step in order, exactly as if it had been read when it ran."""
        pending, self.deferred = self.deferred, []
        for step, why in read_all(pending, self.record.counters):
            self._say_skipped(step, why)
        for entry in pending:
            if entry.step.skipped and entry.tracked is not None:
                self.family.skip_tracked(entry.tracked)
            self.family.learn(entry.step, entry.global_step, entry.lrs, entry.seconds, entry.tracked)

    def _advance(self) -> None:
        due = self.machine.step_done(self.step.phase, self.step.backed_off, self.family.horizon)
        self.decided = due is not None
        if due is not None:
            self.read_deferred()  # the decisions below read what the components learnt
        if due is Due.CYCLE_END and not self._follow_trainable_set():
            self.family.cycle_end()
        elif due in (Due.SEGMENT_END, Due.CORRECTION_END):
            self.family.phase_done(due)
        self.store.release_buffer()  # the step's update has been read; a segment that started holds its snapshot

    # -- an ordinary step, from Lightning's hooks or a loop's own calls ---------------------------------------------
    def record_loss(self, loss: Tensor) -> None:
        """A backward pass of an ordinary step is about to run on ``loss`` (a gradient scaler's, unscaled here)."""
        self.record.add_loss(self.step, self.step_guard.unscaled(loss), False, self.automatic)

    def guard_step(self) -> None:
        """The step's backward passes are done, its update next: read and guard it, once a step (several optimizers
        follow the first one's verdict)."""
        if self.predicting or self.step.guarded:
            return
        self.store.wait_for_optimizer_state()  # copied back after a segment: the update reads it next
        self._check_ordinary_step()

    def drop_skipped(self, optimizer: Optimizer) -> None:
        """``optimizer``'s coming update dropped, with its gradients, where the guard skipped the step."""
        if self.step.skipped and not self.predicting:
            self.step_guard.skip(optimizer)

    def _check_ordinary_step(self) -> None:
        monitor, counters, step, store = self.parts.monitor, self.record.counters, self.step, self.store
        why = self.step_guard.check(step, store.optimizer, store.owners, monitor, self.family.judge, counters)
        step.guarded = True
        self._say_skipped(self.global_step + 1, why)

    def _say_skipped(self, step: int, why: str | None) -> None:
        """The first step of a fit whose update the guard skipped is said as it is read; the rest are counted."""
        if why is not None and not self._said_skip:
            self._warn(skip_message(step, why))
            self._said_skip = True

    # -- reporting and state -------------------------------------------------------------------------------------
    def metrics(self, predicted_loss: float) -> dict[str, float]:
        """The ``hybrid/*`` scalars of the step just ended (a quiet step's are read now)."""
        self.read_deferred()
        return {**self.record.metrics(self.step), **self.family.metrics(self.step, predicted_loss)}

    def summary(self) -> dict[str, Any]:
        """Whole-run numbers in the mode's words, with its settings, as ``hybrid_summary.json`` holds them."""
        self.read_deferred()
        family = self.family
        return {
            "mode": family.mode,
            "predictor": self.parts.predictor.name,
            "settings": family.settings(),
            **self.record.summary(family.phases),
            **family.summary(),
            **({"stepped_aside": self.stepped_aside} if self.stepped_aside else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored = load_engine_state(self, state)
