"""How ordinary steps teach the components: the monitor's reference statistics, the predictor's observations and
prediction errors, the corrector's residuals, the encoder's features and the bandit's costs. The part of
:class:`~.engine.HybridEngine` that reads a finished ordinary step."""

from __future__ import annotations

import math

import torch

from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.phase import Phase


class Learning:
    """Observation of finished steps; mixed into :class:`~.engine.HybridEngine`."""

    def _learn_from(
        self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: list | None = None
    ) -> float:
        """Everything a finished step teaches; returns the loss the predictor expected for it (``nan`` if none).
        ``tracked``: the predictor's statistics of a quiet step's update, folded in when the step ran."""
        predicted_loss = step.predicted_loss
        step.error = math.nan
        if step.phase.ordinary and not step.skipped and math.isfinite(step.loss):
            if self.rule is not None:
                self._rule_observe(step.loss)
            else:
                predicted_loss = self._observe(step, global_step, lrs, tracked)
        self._record_bandit_step(step, seconds)
        return predicted_loss

    def _observe(self, step: StepRecord, global_step: int, lrs: list[float], tracked: list | None = None) -> float:
        """Feed an ordinary step to the monitor, predictor, corrector and encoder; return the predicted loss."""
        parts, phase = self.parts, step.phase
        loss, encoder = step.loss, parts.encoder
        if phase is not Phase.CORRECT:
            parts.monitor.observe(loss, step.grad_norm)
        deltas = self.store.buffer_groups if step.delta_ready and tracked is None else None
        features = encoder.features() if step.delta_ready else None  # the state before this step
        if tracked is not None:
            stats = parts.predictor.learn(global_step, loss, tracked, features)
        else:
            stats = parts.predictor.observe(global_step, loss, deltas, features)
        self.lr_ref = lrs
        if stats is None:
            if step.backed_off:  # the features are refreshed when observation resumes, before any segment
                encoder.observe_loss(global_step, loss, step.grad_norm)
            else:
                encoder.observe(global_step, loss, step.grad_norm, lrs)
            return math.nan
        factors, _ = parts.corrector.correction(features, global_step, len(self.store.groups))
        step.error = stats.scaled(factors).relative_error  # the error of the corrected prediction
        self.record.add_error(step.error)
        if phase is Phase.CORRECT:
            parts.corrector.observe(global_step, stats, features)
        encoder.observe(
            global_step, loss, step.grad_norm, lrs, stats.actual_sq, step.error, loss - stats.predicted_loss
        )
        return stats.predicted_loss

    def _record_bandit_step(self, step: StepRecord, seconds: float) -> None:
        bandit = self.parts.bandit
        if bandit is None:
            return
        if bandit.cost == "wall" and self.world_size > 1:  # every rank must see the same costs
            seconds = self.step_guard.mean_over_ranks([torch.tensor(seconds)])[0]
        loss = step.loss if step.phase.ordinary and not step.skipped else None
        bandit.record_step(step.phase is Phase.PREDICT, seconds, loss, correcting=step.phase is Phase.CORRECT)
