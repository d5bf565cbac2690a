"""How a finished ordinary step teaches the components of per-step prediction (the Predict segments family): the
monitor's reference statistics, the predictor's observation and its error, the corrector's residuals, the state
encoder's features; and what every step costs the horizon bandit."""

from __future__ import annotations

import math
from typing import Any

import torch

from lightning_hybrid.engine.family import EngineView
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.phase import Phase


def teach(engine: EngineView, step: StepRecord, global_step: int, lrs: list[float], tracked: Any) -> float:
    """Feed an ordinary step to the monitor, predictor, corrector and encoder; return the loss the predictor
    expected for it (``nan`` if it made no prediction). ``tracked``: a quiet step's statistics, folded in by the
    predictor on the device when the step ran (``Predictor.track``), to learn from now."""
    parts, phase, loss = engine.parts, step.phase, step.loss
    encoder = parts.encoder
    if phase is not Phase.CORRECT:
        parts.monitor.observe(loss, step.grad_norm)
    features = encoder.features() if step.delta_ready else None  # the state before this step
    if tracked is not None:
        stats = parts.predictor.learn(global_step, loss, tracked, features)
    else:
        deltas = engine.store.buffer_groups if step.delta_ready else None
        stats = parts.predictor.observe(global_step, loss, deltas, features)
    if stats is None:
        if step.backed_off:  # the features are refreshed when observation resumes, before any segment
            encoder.observe_loss(global_step, loss, step.grad_norm)
        else:
            encoder.observe(global_step, loss, step.grad_norm, lrs)
        return math.nan
    factors, _ = parts.corrector.correction(features, global_step, len(engine.store.groups))
    step.error = stats.scaled(factors).relative_error  # the error of the corrected prediction
    engine.record.add_error(step.error)
    if phase is Phase.CORRECT:
        parts.corrector.observe(global_step, stats, features)
    encoder.observe(global_step, loss, step.grad_norm, lrs, stats.actual_sq, step.error, loss - stats.predicted_loss)
    return stats.predicted_loss


def charge_bandit(engine: EngineView, step: StepRecord, seconds: float) -> None:
    """Account a finished step (of any phase) to the horizon bandit, if one chooses horizons."""
    bandit = engine.parts.bandit
    if bandit is None:
        return
    if bandit.cost == "wall" and engine.world_size > 1:  # every rank must see the same costs
        seconds = engine.step_guard.mean_over_ranks([torch.tensor(seconds)])[0]
    loss = step.loss if step.phase.ordinary and not step.skipped else None
    bandit.record_step(step.phase is Phase.PREDICT, seconds, loss, correcting=step.phase is Phase.CORRECT)
