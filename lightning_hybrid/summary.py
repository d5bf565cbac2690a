"""Run counters behind ``hybrid_summary.json`` and the end-of-fit report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_hybrid.phase import Phase


def _per_phase(value: float) -> dict[str, Any]:
    return {phase.label: value for phase in Phase}


@dataclass
class RunCounters:
    """Everything counted over a run; restored from checkpoints so resumed runs report whole-run totals."""

    steps_by_phase: dict[str, int] = field(default_factory=lambda: _per_phase(0))
    time_by_phase_s: dict[str, float] = field(default_factory=lambda: _per_phase(0.0))
    backward_passes: int = 0
    backward_skipped: int = 0
    rollbacks: int = 0
    predicted_steps_rolled_back: int = 0
    segments_started: int = 0  # Predict segments (per-step prediction)
    segments_accepted: int = 0
    jumps_made: int = 0  # outer's jumps along the trajectory
    jumps_kept: int = 0
    jumps_rejected: int = 0  # counted in `rollbacks` too
    jump_restarts: int = 0  # jumps not made: the cycle pointed against the outer momentum, which restarted
    jumps_blind: int = 0  # jumps not made: the cycle's losses spread too widely for the delayed verdict to judge
    rising_lr_cycles: int = 0  # jumps not made: the learning rate rose over the cycle (a warm-up)
    invalid_plans: int = 0
    end_of_fit_rollbacks: int = 0  # segments still unverified when training ended
    nonfinite_steps_skipped: int = 0
    outlier_steps_skipped: int = 0
    backed_off_steps: int = 0  # ordinary steps without update capture or predictor training
    backed_off_by: dict[str, int] = field(default_factory=dict)  # those steps by reason (engine/policy.py's)
    confidence_peak: float | None = None  # the predictor's highest confidence at the end of a Full cycle

    @property
    def steps_total(self) -> int:
        return sum(self.steps_by_phase.values())

    @property
    def predictions_made(self) -> int:
        """Segments started and jumps made: the predictions a run made, whatever its family."""
        return self.segments_started + self.jumps_made

    @property
    def backward_skipped_pct(self) -> float:
        total = self.backward_passes + self.backward_skipped
        return 100.0 * self.backward_skipped / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)

    def summary(self, phases: tuple[Phase, ...]) -> dict[str, Any]:
        """What every mode reports, over the ``phases`` its steps can be in."""
        labels = [phase.label for phase in phases]
        return {
            "steps_total": self.steps_total,
            "steps_by_phase": {label: self.steps_by_phase[label] for label in labels},
            "time_by_phase_s": {label: round(self.time_by_phase_s[label], 4) for label in labels},
            "backward_passes": self.backward_passes,
            "nonfinite_steps_skipped": self.nonfinite_steps_skipped,
            "outlier_steps_skipped": self.outlier_steps_skipped,
        }


@dataclass(frozen=True)
class FitStart:
    """The global step a fit began at, and its steps and step seconds by phase (then, or since)."""

    global_step: int
    steps_by_phase: dict[str, int]
    time_by_phase_s: dict[str, float]
    afresh: bool = False  # the plugin's counts begin here, at a resumed step (a checkpoint without its state)


def counted(count: int, noun: str) -> str:
    """``1 jump``, ``2 jumps``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _by_phase(steps: dict[str, int]) -> str:
    """``100 in the plugin's warm-up (warmup_steps), 200 full``: the warm-up named as the plugin's, not a learning-rate
    warm-up of the user's module; phases with no step left out."""
    return ", ".join(
        f"{n} in the plugin's warm-up (warmup_steps)" if phase == "warmup" else f"{n} {phase}"
        for phase, n in steps.items()
        if n
    )


def format_summary(summary: dict[str, Any], mode_lines: list[str], fit: FitStart | None = None) -> str:
    """A few lines for the end of ``fit``: the steps (from the start of training; where this fit resumed, also what
    ``fit`` ran; from the resumed step where the checkpoint held no plugin state), what the mode did
    (``mode_lines``), the guard, and the shares of this fit's step time by phase."""
    ran = sum(fit.steps_by_phase.values()) if fit is not None else summary["steps_total"]
    if summary.get("stepped_aside") and ran == 0:  # nothing of the plugin's ran this fit: nothing else to say
        return f"hybrid: stepped aside {summary['stepped_aside']}; the fit was plain Lightning"
    total = counted(summary["steps_total"], "step")
    head = f"hybrid ({summary['mode']}, {summary['predictor']}): {total}"
    if fit is not None and fit.afresh:
        head += f" from step {fit.global_step}, where this fit resumed a checkpoint without the plugin's state: "
        head += _by_phase(summary["steps_by_phase"])
    elif fit is not None and fit.global_step > 0:
        ran = sum(fit.steps_by_phase.values())
        head += f" since training began: {_by_phase(summary['steps_by_phase'])}; this fit resumed at step "
        head += f"{fit.global_step} and ran {ran} ({_by_phase(fit.steps_by_phase) or 'none'})"
    else:
        head += f": {_by_phase(summary['steps_by_phase'])}" if summary["steps_total"] else ""
    lines = [head, *mode_lines]
    if summary.get("stepped_aside"):
        lines.append(f"hybrid: stepped aside {summary['stepped_aside']}; the rest of the fit was plain Lightning")
    nonfinite, outliers = summary["nonfinite_steps_skipped"], summary["outlier_steps_skipped"]
    if nonfinite or outliers:
        lines.append(f"hybrid: skipped {nonfinite} non-finite and {outliers} exploding-gradient steps")
    spent = fit.time_by_phase_s if fit is not None else summary["time_by_phase_s"]
    spent = {phase: spent.get(phase, 0.0) for phase in summary["time_by_phase_s"]}  # the mode's phases only
    seconds = sum(spent.values())
    if seconds > 0:  # shares, not seconds: the run's one time is its training time (RunMeter, mode=compare's table)
        shares = ", ".join(f"{phase} {t / seconds:.0%}" for phase, t in spent.items())
        lines.append(f"hybrid: this fit's step time by phase: {shares}")
    return "\n".join(lines)
