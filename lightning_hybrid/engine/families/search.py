"""``search``: a probe-verified line search after some ordinary updates, which judges each step it takes against
not taking it (the same probe batches, with and without the step) and steps aside where searching does not pay.

Every ``every`` ordinary steps after warmup, the step's update is captured, and after it the rule repeats the
update while the probe's loss falls (:class:`~lightning_hybrid.predictors.LineSearch`). A search that keeps no
repetition doubles the gap to the next one, up to ``max_interval``; one that keeps a repetition brings the gap back
to ``every``. Between searches, steps are quiet (guarded on the device where the optimizer allows); outside a
search the family holds no parameter copy, and during one, the update and the last kept point. With ``span`` above
1, the weights at the span's start are held from there to the search, which runs along the mean update since.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.family import PredictionFamily, register_family
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.phase import Phase


@register_family
class ProbeSearch(PredictionFamily):
    """Schedules the searches of a :class:`~lightning_hybrid.predictors.LineSearch` (see the module's doc)."""

    name = "search"
    gated = False  # every backward pass is kept
    needs_probe = True

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.interval = 0  # steps from one search to the next (set up from the rule)
        self.next_search = 0  # the global step at which the next search may start
        self.anchor: list[Tensor] | None = None  # span > 1: the weights at the span's start (this rank's part)
        self.anchor_step = 0  # the global step at which they were taken

    @classmethod
    def check(cls, config: HybridConfig, parts: Components, sharded: bool) -> None:
        super().check(config, parts, sharded)
        if parts.probe is None:
            raise ValueError(f"predictor={parts.predictor.name!r} needs a probe, which the HybridScheduler provides")

    @property
    def rule(self) -> Any:
        return self.engine.parts.predictor

    def setup(self, restored: bool) -> None:
        params = self.engine.store.params
        if restored and self.anchor is not None:  # from a checkpoint, on the host: to the weights' devices
            self.anchor = [a.to(p.device) for a, p in zip(self.anchor, params, strict=True)]
        if not restored:
            self.interval, self.next_search = self.rule.every, self.engine.config.warmup_steps + self.rule.every
            self.anchor = None

    # -- ordinary steps ------------------------------------------------------------------------------------------
    def begin_step(self, step: StepRecord) -> bool:
        """A search step captures its update (or, with a span, follows the span's start) and is read at once; any
        other may be quiet."""
        e, span = self.engine, self.rule.span
        ready = e.parts.probe.ready and e.config.enable_prediction and not e.policy.prediction_off
        ready = ready and step.phase is not Phase.WARMUP and not step.backed_off
        if span == 1:
            step.capture = ready and e.global_step >= self.next_search
            return not step.capture
        if self.anchor is None and ready and e.global_step >= self.next_search - span + 1:
            self.anchor, self.anchor_step = torch._foreach_mul(e.store.params, 1.0), e.global_step
        return not (self.anchor is not None and e.global_step + 1 - self.anchor_step >= span and ready)

    def step_ended(self, step: StepRecord) -> None:
        """The search step's update is done: search along it (a skipped update is tried again next step)."""
        e = self.engine
        if self.rule.span == 1 and step.delta_ready and not step.skipped:
            direction = e.store.buffer
        elif self.rule.span > 1 and self._span_done(step):
            direction = self._mean_update()
        else:
            return
        taken, _ = self.rule.search(e.store.params, direction, self._probe_loss)
        e.collectives.parameters_changed()
        self.anchor = None
        counters = e.record.counters
        counters.searches += 1
        counters.search_steps += taken
        self.interval = self.rule.every if taken else min(2 * self.interval, self.rule.max_interval)
        self.next_search = e.global_step + self.interval

    def _span_done(self, step: StepRecord) -> bool:
        done = self.engine.global_step - self.anchor_step >= self.rule.span
        return self.anchor is not None and not step.skipped and done

    def _mean_update(self) -> list[Tensor]:
        """The span's start turned into the mean update since, in place (no second copy)."""
        e, anchor = self.engine, self.anchor
        torch._foreach_sub_(anchor, e.store.params)  # start - now
        torch._foreach_mul_(anchor, -1.0 / (e.global_step - self.anchor_step))
        return anchor

    def _probe_loss(self) -> float:
        self.engine.collectives.parameters_changed()  # FSDP: gather the weights as they are now
        return self.engine.parts.probe.loss()

    def learn(self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: Any) -> float:
        """Ordinary steps' losses feed the divergence statistics (the gradient-outlier limit)."""
        if step.phase.ordinary and not step.skipped and math.isfinite(step.loss):
            self.engine.parts.monitor.observe(step.loss, step.grad_norm)
        return step.predicted_loss

    # -- reporting and state -------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {"search_interval": self.interval}

    def state_dict(self) -> dict[str, Any]:
        anchor = None if self.anchor is None else [t.detach().to("cpu", copy=True) for t in self.anchor]
        return {
            "interval": self.interval,
            "next_search": self.next_search,
            "anchor_step": self.anchor_step,
            "anchor": anchor,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Checkpoints are restored before training starts; :meth:`setup` places a span's start then."""
        self.interval, self.next_search = int(state["interval"]), int(state["next_search"])
        self.anchor, self.anchor_step = state.get("anchor"), int(state.get("anchor_step", 0))  # absent before spans
