"""``average`` (generalized primal averaging on top of the user's optimizer): every backward pass is kept. After
warmup, the optimizer's own sequence ``z`` takes each update from a gradient computed at ``y``, a point between
it and the average ``x``, which is the model that validation, checkpoints and the end of ``fit`` see (as with
Lightning's weight-averaging callbacks). The parameters hold ``y`` between steps; nothing is judged or undone."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.family import PredictionFamily, register_family
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.engine.store import copy_
from lightning_hybrid.phase import Phase


@register_family
class PrimalAveraging(PredictionFamily):
    """Steps of a :class:`~lightning_hybrid.predictors.PrimalAverage` rule on the optimizer's sequence, and the
    average shown outside them (see the module's doc)."""

    name = "averaging"
    gated = False

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.started = False  # the average has been set, at the first Full step
        self.showing = False  # validation sees the average; the store's buffer holds the trained weights
        self.on_optimizer_sequence = False  # within a step: the weights are z, awaiting the update

    @classmethod
    def check(cls, config: HybridConfig, parts: Components, sharded: bool) -> None:
        super().check(config, parts, sharded)
        if sharded:
            raise ValueError(
                f"predictor={parts.predictor.name!r} is not supported with sharded parameters (hybrid_fsdp): its "
                "checkpoints hold the average in place of the sharded weights, which is not implemented; use "
                "hybrid_ddp."
            )

    @property
    def rule(self) -> Any:
        return self.engine.parts.predictor

    def setup(self, restored: bool) -> None:
        """Unless a checkpoint has just restored the run's state, averaging starts afresh at the next Full step."""
        self.rule.setup(self.engine.store.params, keep_jump=False)
        if not restored:
            self.started = False

    def begin_step(self, step: StepRecord) -> bool:
        if step.phase is Phase.FULL and not step.backed_off and not self.started:
            self.rule.restart(self.engine.store.params)  # x = y = z at the current weights
            self.started = True
        return False

    def gradients_taken(self) -> None:
        """The backward pass is done (at ``y``): the optimizer's update goes to its own sequence ``z``. Inside
        ``optimizer.step(closure)``, after the closure; the optimizer's pre-step hook would be too early, since
        Lightning runs the closure inside ``step``."""
        step = self.engine.step
        if self.started and step.phase is Phase.FULL and not step.backed_off:
            self.rule.to_optimizer_sequence(self.engine.store.params)
            self.on_optimizer_sequence = True

    def after_update(self) -> None:
        if self.on_optimizer_sequence:
            self.rule.to_gradient_point(self.engine.store.params)
            self.on_optimizer_sequence = False

    def step_ended(self, step: StepRecord) -> None:
        """A step whose update never ran (a gradient scaler skipped it): back to ``y``, with ``x`` unchanged."""
        if self.on_optimizer_sequence:
            self.rule.back_to_gradient_point(self.engine.store.params)
            self.on_optimizer_sequence = False

    def learn(self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: Any) -> float:
        if step.phase.ordinary and not step.skipped and math.isfinite(step.loss):
            self.engine.parts.monitor.observe(step.loss, step.grad_norm)
        return step.predicted_loss

    # -- what validation, checkpoints and the end of fit see -----------------------------------------------------
    def validation_start(self) -> None:
        """Validation during ``fit``: the weights are the average; the trained ones wait in the store's buffer."""
        e = self.engine
        if self.started and not self.showing:
            e.store.hold_params()
            copy_(e.store.params, self.rule.average)
            self.showing = True
            e.collectives.parameters_changed()

    def validation_end(self) -> None:
        e = self.engine
        if self.showing:
            copy_(e.store.params, e.store.buffer)
            e.store.release_buffer()
            self.showing = False
            e.collectives.parameters_changed()

    def checkpoint_weights(self) -> list[tuple[Tensor, Tensor]]:
        """``(parameter, its average)`` pairs while ``fit`` runs; after it the weights are the average."""
        store = self.engine.store
        return list(zip(store.owners, self.rule.average)) if self.started and store is not None else []

    def end_fit(self) -> None:
        """The averaged sequence is the model ``fit`` hands back; then the rule lets its device copy go."""
        self.validation_end()
        if self.started:
            copy_(self.engine.store.params, self.rule.average)
            self.engine.collectives.parameters_changed()
        self.rule.release()

    # -- reporting and state -------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {"trajectory_rule": self.rule.name}

    def state_dict(self) -> dict[str, Any]:
        return {"started": self.started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started = bool(state["started"])

    @staticmethod
    def migrate_v1(state: dict[str, Any]) -> dict[str, Any]:
        trajectory = state.get("trajectory")
        if trajectory is None:
            raise ValueError("it was written by a per-step predictor's run; resume it with that predictor")
        return {"started": bool(trajectory["started"])}
