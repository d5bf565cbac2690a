"""What the per-step mode shows the user: its ``hybrid/*`` scalars (confidence, horizon, rollbacks, backward
passes skipped), the progress bar's share skipped, the summary's counters and the end-of-fit text, in the words of
Predict segments."""

from __future__ import annotations

import math
from typing import Any

from lightning_hybrid.engine.policy import LEARNING_RATE, PAUSED, SWITCHED_OFF
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import counted


class SegmentReport:
    """The reporting half of :class:`~lightning_hybrid.engine.families.segments.PredictSegments` (its ``engine``,
    ``horizon``, ``factors`` and ``bandit_arm``)."""

    engine: Any
    horizon: int
    factors: list[float]
    bandit_arm: int

    def metrics(self, step: StepRecord, predicted_loss: float) -> dict[str, float]:
        """The band has zero width on ordinary steps, where the one-step prediction carries no bound, so the value,
        lower and upper curves always share their steps (which TensorBoard's margin chart needs)."""
        parts, counters = self.engine.parts, self.engine.record.counters
        band = step.band if math.isfinite(step.band) else 0.0
        metrics = {
            "hybrid/loss_predicted": predicted_loss,
            "hybrid/loss_predicted_lower": predicted_loss - band,
            "hybrid/loss_predicted_upper": predicted_loss + band,
            "hybrid/prediction_error": step.error,
            "hybrid/confidence": parts.predictor.confidence(),
            "hybrid/horizon": float(self.horizon if step.phase is Phase.PREDICT else 0),
            "hybrid/correction_magnitude": max((abs(math.log(f)) for f in self.factors), default=0.0),
            "hybrid/uncertainty": parts.predictor.uncertainty(),
            "hybrid/rollbacks": float(counters.rollbacks),
            "hybrid/backward_skipped_pct": counters.backward_skipped_pct,
        }
        if parts.bandit is not None:
            metrics["hybrid/bandit_arm"] = float(self.bandit_arm)
        return metrics

    def progress(self) -> dict[str, float]:
        """The share of backward passes skipped so far, in percent."""
        return {"skipped": round(self.engine.record.counters.backward_skipped_pct, 1)}

    def summary(self) -> dict[str, Any]:
        e = self.engine
        c, bandit = e.record.counters, e.parts.bandit
        out = {
            "backward_skipped": c.backward_skipped,
            "backward_skipped_pct": round(c.backward_skipped_pct, 3),
            "segments_started": c.segments_started,
            "segments_accepted": c.segments_accepted,
            "rollbacks": c.rollbacks,
            "predicted_steps_rolled_back": c.predicted_steps_rolled_back,
            "invalid_plans": c.invalid_plans,
            "rollback_reasons": {
                **e.parts.monitor.events,
                "invalid_plan": c.invalid_plans,
                "end_of_fit": c.end_of_fit_rollbacks,
            },
            "backed_off_steps": c.backed_off_steps,
            "backed_off_by": dict(sorted(c.backed_off_by.items())),
            "confidence_peak": None if c.confidence_peak is None else round(c.confidence_peak, 4),
            "prediction_disabled": e.policy.prediction_off,
            "final_confidence": e.parts.predictor.confidence(),
            "mean_prediction_error": e.record.mean_error(),
        }
        if bandit is not None:
            out["arm_counts"] = {str(a): n for a, n in zip(bandit.horizons, bandit.counts)}
        return out

    def report(self, summary: dict[str, Any]) -> list[str]:
        settings = summary["settings"]
        if not settings["enable_prediction"]:
            return [
                "hybrid: prediction switched off (enable_prediction=False): plain training with the plugin's checks"
            ]
        started, rolled_back = summary["segments_started"], summary["rollbacks"]
        line = (
            f"hybrid: {counted(started, 'predict segment')}, {summary['segments_accepted']} accepted, "
            f"{rolled_back} rolled back"
        )
        if summary["invalid_plans"]:
            line += f" ({counted(summary['invalid_plans'], 'invalid plan')})"
        line += f" | backward skipped {summary['backward_skipped_pct']:.1f}%"
        if summary["backed_off_steps"]:
            line += f" | {counted(summary['backed_off_steps'], 'step')} backed off"
        lines = [line, *why_little_prediction(summary)]
        if summary["prediction_disabled"]:
            lines.append(
                f"hybrid: prediction switched off after {settings['max_consecutive_rollbacks']} failures in a row; "
                "the rest of the run was plain training"
            )
        return lines


# how each reason a step was backed off reads (engine/policy.py's reasons)
BACKED_OFF_WORDS = {
    LEARNING_RATE: "waited for the learning rate to fall to predict_lr_fraction={predict_lr_fraction} of its peak",
    PAUSED: "paused after Full cycles that ended without a segment",
    SWITCHED_OFF: "had prediction switched off",
}


def why_little_prediction(summary: dict[str, Any]) -> list[str]:
    """Why a run predicted little or nothing: the steps backed off by reason and, where no segment started, what
    stood in the way, with the settings that move it."""
    settings, lines = summary["settings"], []
    by = summary["backed_off_by"]
    if by:
        parts = [f"{n} {BACKED_OFF_WORDS[why].format(**settings)}" for why, n in by.items()]
        lines.append(f"hybrid: of the steps backed off, {'; '.join(parts)}")
    if summary["segments_started"] == 0:
        peak, threshold = summary["confidence_peak"], settings["confidence_threshold"]
        if peak is None:
            lines.append(
                "hybrid: no Predict segment: the predictor never had enough observed updates to predict "
                "(train longer, or lower warmup_steps, or predict_lr_fraction (1.0: at any learning rate))"
            )
        elif peak < threshold:
            lines.append(
                f"hybrid: no Predict segment: the predictor's confidence reached {peak:.2f} at most, under "
                f"confidence_threshold={threshold} (hybrid=aggressive uses 0.3)"
            )
    return lines
