"""The run record: what one step measured, the whole-run counters and clock, the per-step scalars for the loggers
and the summary written to ``hybrid_summary.json``."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import FitStart, RunCounters


@dataclass
class StepRecord:
    """What the engine learns during one optimizer step (all micro-batches of an accumulated step)."""

    phase: Phase = Phase.WARMUP  # the phase the step started in
    started: float = 0.0  # perf_counter at its start
    backed_off: str | None = None  # why the step neither captures nor teaches (the policy's reasons), if it does not
    capture: bool = False  # the optimizer's update is captured into the store's buffer
    delta_ready: bool = False  # and it has been: the buffer holds new - old
    skipped: bool = False  # the update did not reach the weights
    loss_sum: Tensor | None = None  # losses passed to backward, summed over micro-batches
    forward_loss: Tensor | None = None  # a predicted step's forward check
    loss: float = math.nan
    predicted_loss: float = math.nan
    band: float = math.nan  # half-width of the predicted loss's band, on predicted steps
    error: float = math.nan
    grad_norm: float = math.nan
    quiet: bool = False  # guarded on the device, read later (see :class:`Deferred`)
    guarded: bool = False  # the guard has decided for this step (several optimizers: the first one's step)
    backwards: int = 0  # backward passes in the step
    # a quiet step's reading: on the device, the guard's measurement and skip; read, [loss, grad_norm, nonfinite,
    # outlier]
    reading: tuple[Tensor, Tensor] | list[float] | None = None


@dataclass
class RunRecord:
    """Counters, prediction errors and the training clock of a run; restored from checkpoints so a resumed run
    reports whole-run totals."""

    counters: RunCounters = field(default_factory=RunCounters)
    errors: dict[str, float] = field(default_factory=lambda: {"sum": 0.0, "count": 0})
    wall_base: float = 0.0
    wall_t0: float = 0.0
    fit_start: FitStart | None = None  # where this fit began: the counters a resumed run restored run from step 0

    def start_clock(self, global_step: int = 0) -> None:
        """Training starts (or resumes) at ``global_step``."""
        self.wall_t0 = time.perf_counter()
        c = self.counters
        steps, seconds = dict(c.steps_by_phase), dict(c.time_by_phase_s)
        self.fit_start = FitStart(global_step, steps, seconds, self.afresh(global_step))

    def afresh(self, global_step: int) -> bool:
        """Whether a fit starting at ``global_step`` starts the plugin's counts there: a resumed step with nothing
        counted before it (a checkpoint without the plugin's state, a plain run's)."""
        return global_step > 0 and not any(self.counters.steps_by_phase.values())

    def this_fit(self) -> FitStart:
        """What this fit ran: its first step, and its steps and their time by phase (the restored ones left out)."""
        start, c = self.fit_start or FitStart(0, {}, {}), self.counters
        steps = {k: n - start.steps_by_phase.get(k, 0) for k, n in c.steps_by_phase.items()}
        seconds = {k: t - start.time_by_phase_s.get(k, 0.0) for k, t in c.time_by_phase_s.items()}
        return FitStart(start.global_step, steps, seconds, start.afresh)

    def stop_clock(self) -> None:
        self.wall_base, self.wall_t0 = self.wall_time(), 0.0

    def wall_time(self) -> float:
        return self.wall_base + (time.perf_counter() - self.wall_t0 if self.wall_t0 else 0.0)

    def add_error(self, error: float) -> None:
        self.errors["sum"] += error
        self.errors["count"] += 1

    def add_loss(self, step: StepRecord, loss: Tensor, predicting: bool, automatic: bool) -> None:
        """A loss passed to ``backward`` (summed over accumulated micro-batches): a backward pass on an ordinary
        step; a predicted step's forward check under manual optimization (automatic Predict steps record theirs in
        the family's training step)."""
        loss = loss.detach().float()
        if predicting:
            if not automatic:
                step.forward_loss = loss if step.forward_loss is None else step.forward_loss + loss
        else:
            step.loss_sum = loss if step.loss_sum is None else step.loss_sum + loss
            step.backwards += 1
            self.counters.backward_passes += 1

    def count_step(self, step: StepRecord, seconds: float) -> None:
        label = step.phase.label
        self.counters.steps_by_phase[label] += 1
        self.counters.time_by_phase_s[label] += seconds
        if step.backed_off:
            self.counters.backed_off_steps += 1
            by = self.counters.backed_off_by
            by[step.backed_off] = by.get(step.backed_off, 0) + 1

    def metrics(self, step: StepRecord) -> dict[str, float]:
        """The ``hybrid/*`` scalars of a finished step that every family logs (the family adds its own): the phase
        and the loss (``nan`` where the step has none: a predicted step without a forward check)."""
        return {"hybrid/phase": float(step.phase), "hybrid/loss": step.loss}

    def summary(self, phases: tuple[Phase, ...]) -> dict[str, Any]:
        out = self.counters.summary(phases)
        out["wall_time_s"] = round(self.wall_time(), 4)  # training start to end, validation included
        return out

    def mean_error(self) -> float | None:
        count = self.errors["count"]
        return self.errors["sum"] / count if count else None

    def state_dict(self) -> dict[str, Any]:
        return {"counters": self.counters.to_dict(), "errors": dict(self.errors), "wall_time_s": self.wall_time()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counters = RunCounters()
        self.counters.load(state["counters"])
        self.errors = dict(state["errors"])
        self.wall_base, self.wall_t0 = float(state["wall_time_s"]), 0.0
