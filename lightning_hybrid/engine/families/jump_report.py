"""What the ``outer`` jumps show the user: the running counts, the last verdict, the jump's size and the cycle's
margin as ``hybrid/*`` scalars, the progress bar's counts, the summary's and the end-of-fit text, in the words of the
default rule (jumps made, kept, undone; cycles that restarted the momentum or were too noisy to judge)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.summary import counted


@dataclass
class Readings:
    """What the scalars show of the rule's last decisions. Not checkpointed: a resumed run shows them again from
    its first decision."""

    verdict: tuple[float, float, float] | None = None  # the last delayed verdict: window means before, after; margin
    size: Tensor | tuple[float, float] | None = None  # the last jump's [|d|², |w|²] over ranks, read with the jump's
    # one read of the host, or on the device until shown
    cycle_margin: float = math.nan  # the last cycle's verdict margin as a fraction of its mean loss


class JumpReport:
    """The reporting half of :class:`~lightning_hybrid.engine.families.jumps.OuterJumps` (its ``engine``, ``state``,
    ``readings`` and ``alignment_window``)."""

    engine: Any
    state: Any
    readings: Readings
    alignment_window: int

    def counts(self) -> dict[str, int]:
        """The running counts, by the names the scalars, the summary and the text share: made = kept + undone (+ one
        awaiting its verdict); restarts and blind cycles are cycles that made no jump."""
        c = self.engine.record.counters
        return {
            "jumps_made": c.jumps_made,
            "jumps_kept": c.jumps_kept,
            "jumps_undone": c.jumps_rejected,
            "momentum_restarts": c.jump_restarts,
            "blind_cycles": c.jumps_blind,
        }

    def metrics(self, step: StepRecord, predicted_loss: float) -> dict[str, float]:
        """The running counts, and the last decisions' readings (``nan`` until the first of each)."""
        out = {f"hybrid/{name}": float(value) for name, value in self.counts().items()}
        readings, rule = self.readings, self.engine.parts.predictor
        before, after, margin = readings.verdict or (math.nan, math.nan, math.nan)
        out.update({"hybrid/verdict_before": before, "hybrid/verdict_after": after, "hybrid/verdict_margin": margin})
        size = readings.size if readings.size is not None else (math.nan, math.nan)
        jump_sq, weights_sq = size.tolist() if isinstance(size, Tensor) else size
        out["hybrid/jump_size"] = math.sqrt(jump_sq / weights_sq) if weights_sq > 0 else math.nan
        out["hybrid/cycle_margin"] = readings.cycle_margin
        if rule.verify_resolution > 0 and rule.window > 0:
            out["hybrid/verify_resolution"] = rule.verify_resolution
        return out

    def progress(self) -> dict[str, float]:
        """The bar's counts, as a cycle ends: the jumps made and, where verdicts judge them, those kept."""
        c = self.engine.record.counters
        if self.engine.parts.predictor.window == 0:  # nothing is judged: nothing kept or undone to show
            return {"jumps": float(c.jumps_made)}
        return {"jumps": float(c.jumps_made), "kept": float(c.jumps_kept)}

    def summary(self) -> dict[str, Any]:
        e = self.engine
        out: dict[str, Any] = {
            **self.counts(),
            "jumps_undone_at_end": e.record.counters.end_of_fit_rollbacks,
            "undone_by": {
                "divergence": e.parts.monitor.events.get("nonfinite", 0) + e.parts.monitor.events.get("zscore", 0),
                "verdict": e.parts.monitor.events.get("delayed", 0),
                "end_of_fit": e.record.counters.end_of_fit_rollbacks,
            },
            "jumps_switched_off": e.policy.prediction_off,
            "rising_lr_cycles": e.record.counters.rising_lr_cycles,
        }
        if self.alignment_window:
            alignments = self.state.alignments
            out["jump_alignment"] = statistics.fmean(alignments) if alignments else None
            out["jumps_stopped_at"] = self.state.stopped_at if self.state.stopped_at >= 0 else None
        return out

    def report(self, summary: dict[str, Any]) -> list[str]:
        settings = summary["settings"]
        if not settings["enable_prediction"]:
            return ["hybrid: jumps switched off (enable_prediction=False): plain training with the plugin's checks"]
        made, undone = summary["jumps_made"], summary["jumps_undone"]
        judged = "none judged (verify_window=0)"
        if settings["verify_window"]:
            judged = f"{summary['jumps_kept']} kept, {undone} undone"
        line = f"hybrid: {counted(made, 'jump')} made, {judged}"
        by = summary["undone_by"]
        reasons = {"verdict": "by the verdict", "divergence": "at once, diverging", "end_of_fit": "at the end of fit"}
        why = [f"{by[key]} {words}" for key, words in reasons.items() if by.get(key)]
        if why:  # each undo is counted here, not said as it happens: the verdict at work is not news
            line += f" ({', '.join(why)})"
        without = {"momentum_restarts": "restarted the momentum instead", "blind_cycles": "too noisy to judge a jump"}
        without["rising_lr_cycles"] = "on a rising learning rate"
        said = [f"{counted(summary[key], 'cycle')} {what}" for key, what in without.items() if summary[key]]
        lines = [line + (f"; {'; '.join(said)}" if said else "")]
        if summary["jumps_switched_off"]:
            lines.append(
                f"hybrid: jumps switched off after {settings['max_consecutive_rollbacks']} undone in a row; "
                "the rest of the run was plain training"
            )
        if summary.get("jumps_stopped_at") is not None:
            lines.append(
                f"hybrid: jumps stopped at step {summary['jumps_stopped_at']}: training walked them back "
                f"(mean alignment {summary['jump_alignment']:+.3f})"
            )
        return lines
