"""``search``: a probe-verified line search after some ordinary updates, which judges each step it takes against
not taking it (the same probe batches, with and without the step) and steps aside where searching does not pay.

Every ``every`` ordinary steps after warmup, the step's update is captured, and after it the rule repeats the
update while the probe's loss falls (:class:`~lightning_hybrid.predictors.LineSearch`). A search that keeps no
repetition doubles the gap to the next one, up to ``max_interval``; one that keeps a repetition brings the gap back
to ``every``. Between searches, steps are quiet (guarded on the device where the optimizer allows); outside a
search the family holds no parameter copy, and during one, the update and the last kept point.
"""

from __future__ import annotations

import math
from typing import Any

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

    @classmethod
    def check(cls, config: HybridConfig, parts: Components, sharded: bool) -> None:
        super().check(config, parts, sharded)
        if parts.probe is None:
            raise ValueError(f"predictor={parts.predictor.name!r} needs a probe, which the HybridScheduler provides")

    @property
    def rule(self) -> Any:
        return self.engine.parts.predictor

    def setup(self, restored: bool) -> None:
        if not restored:
            self.interval, self.next_search = self.rule.every, self.engine.config.warmup_steps + self.rule.every

    # -- ordinary steps ------------------------------------------------------------------------------------------
    def begin_step(self, step: StepRecord) -> bool:
        """A search step captures its update and is read at once; any other may be quiet."""
        e = self.engine
        ready = e.parts.probe.ready and e.config.enable_prediction and not e.policy.prediction_off
        due = step.phase is not Phase.WARMUP and not step.backed_off and e.global_step >= self.next_search
        step.capture = ready and due
        return not step.capture

    def step_ended(self, step: StepRecord) -> None:
        """The search step's update is done: search along it (a skipped update is tried again next step)."""
        if not (step.delta_ready and not step.skipped):
            return
        e = self.engine
        taken, _ = self.rule.search(e.store.params, e.store.buffer, self._probe_loss)
        e.collectives.parameters_changed()
        counters = e.record.counters
        counters.searches += 1
        counters.search_steps += taken
        self.interval = self.rule.every if taken else min(2 * self.interval, self.rule.max_interval)
        self.next_search = e.global_step + self.interval

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
        return {"interval": self.interval, "next_search": self.next_search}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.interval, self.next_search = int(state["interval"]), int(state["next_search"])
