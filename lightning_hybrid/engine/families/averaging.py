"""``averaging``: a primal-averaging rule (``gpa``) run at every ordinary step of the Full phase. The optimizer steps
the parameters at the training point ``y``; after each step the rule folds the update into its sequences and leaves
the next ``y``. Wherever the run is evaluated (validation inside ``fit``, checkpoints, the weights ``fit`` hands
back) the parameters hold the average ``x`` instead, swapped in and out as Lightning's ``WeightAveraging`` does. No
verdict: nothing is predicted that a later loss could judge; the engine's guard still keeps a non-finite or
exploding step from every sequence."""

from __future__ import annotations

import math
from typing import Any

import torch

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.family import PredictionFamily, register_family
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import counted


@register_family
class PrimalAverages(PredictionFamily):
    """Averages of a :class:`~lightning_hybrid.predictors.PrimalAveraging` rule (see the module's doc)."""

    name = "averaging"
    gated = False  # every backward pass is kept
    phases = (Phase.WARMUP, Phase.FULL)

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.started = False  # the sequences exist: the parameters hold y while training, x while evaluated
        self.averaged = 0  # steps folded in
        self.evaluating = False  # the parameters hold x now

    @classmethod
    def first_judged_step(cls, config: HybridConfig, predictor: Any) -> int:
        return config.warmup_steps + 1  # the first averaged step: there is no verdict to wait for

    def setup(self, restored: bool) -> None:
        """A checkpoint's parameters hold ``x``: training goes on from ``y``, computed from the restored ``z`` and
        ``x``. Otherwise averaging starts afresh at the first Full step."""
        e = self.engine
        e.parts.predictor.setup(e.store.params, keep_jump=False)
        self.evaluating = False
        if not restored:
            self.started, self.averaged = False, 0
        elif self.started:
            e.parts.predictor.training_point(e.store.params)
            e.collectives.parameters_changed()
        self._ones = torch.ones((), device=e.collectives.root_device)

    def begin_step(self, step: StepRecord) -> bool:
        if not self.started and step.phase is Phase.FULL and not step.backed_off:
            self.engine.parts.predictor.start(self.engine.store.params)
            self.started = True
        return True  # no verdict waits on any step: each may be guarded on the device and read later

    def _averaging(self, step: StepRecord) -> bool:
        return self.started and step.phase is Phase.FULL and not step.backed_off

    def track(self, step: StepRecord) -> None:
        """A quiet step: fold its update in now, kept or not as the guard decided on the device."""
        if self._averaging(step):
            _, skipped = step.reading
            self.engine.parts.predictor.average(self.engine.store.params, 1 - skipped)
        return None

    def learn(self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: Any) -> float:
        """A step read on the host is folded in now (a quiet one was, as it ended); either way it is counted once its
        guard's verdict is known."""
        if not self._averaging(step) or step.skipped:
            return step.predicted_loss
        if not step.quiet:
            self.engine.parts.predictor.average(self.engine.store.params, self._ones)
        self.averaged += 1
        return step.predicted_loss

    # -- evaluated at the average ----------------------------------------------------------------------------------
    def evaluate(self, on: bool) -> bool:
        e = self.engine
        if not self.started or on == self.evaluating:
            return False
        rule, params = e.parts.predictor, e.store.params
        rule.evaluation_point(params) if on else rule.training_point(params)
        e.collectives.parameters_changed()
        self.evaluating = on
        return True

    def evaluated_weights(self) -> list[torch.Tensor] | None:
        """A checkpoint holds the average, as validation sees it; the parameters hold ``y`` while training."""
        return self.engine.parts.predictor.average_point() if self.started and not self.evaluating else None

    def end_fit(self) -> None:
        """``fit`` hands back the average."""
        self.evaluate(True)
        self.engine.parts.predictor.release()

    # -- reporting and state -------------------------------------------------------------------------------------
    def metrics(self, step: StepRecord, predicted_loss: float) -> dict[str, float]:
        gap = math.nan
        if self.started:
            e = self.engine
            apart, size = e.collectives.sum_across_ranks(e.parts.predictor.gap_terms(e.store.params)).tolist()
            gap = math.sqrt(apart / size) if size > 0 else math.nan
        return {"hybrid/averaged_steps": float(self.averaged), "hybrid/average_gap": gap}

    def progress(self) -> dict[str, float]:
        return {"averaged": float(self.averaged)}

    def summary(self) -> dict[str, Any]:
        return {"averaged_steps": self.averaged}

    def report(self, summary: dict[str, Any]) -> list[str]:
        settings = summary["settings"]
        if not summary["averaged_steps"]:
            return ["hybrid: averaged no step: validation, checkpoints and the end of fit saw the weights trained"]
        return [
            f"hybrid: averaged {counted(summary['averaged_steps'], 'step')} (mu_x={settings['mu_x']}, "
            f"mu_y={settings['mu_y']}); validation, checkpoints and the end of fit see the average"
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"started": self.started, "averaged": self.averaged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started, self.averaged = bool(state["started"]), int(state["averaged"])
