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
    invalid_plans: int = 0
    end_of_fit_rollbacks: int = 0  # segments still unverified when training ended
    nonfinite_steps_skipped: int = 0
    outlier_steps_skipped: int = 0
    backed_off_steps: int = 0  # ordinary steps without update capture or predictor training

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

    def summary(self) -> dict[str, Any]:
        out = {"steps_total": self.steps_total, "backward_skipped_pct": round(self.backward_skipped_pct, 3)}
        out.update(self.to_dict())
        out["time_by_phase_s"] = {k: round(v, 4) for k, v in self.time_by_phase_s.items()}
        return out


def _restarts(summary: dict[str, Any]) -> str:
    said = []
    if summary["jump_restarts"]:
        said.append(f"{summary['jump_restarts']} cycles restarted the momentum instead")
    if summary.get("jumps_blind"):
        said.append(f"{summary['jumps_blind']} cycles too noisy to judge one")
    return f" ({'; '.join(said)})" if said else ""


def format_summary(summary: dict[str, Any]) -> str:
    """A few human-readable lines for the end of ``fit``."""
    steps = summary["steps_by_phase"]
    times = summary["time_by_phase_s"]
    lines = [
        f"hybrid: {summary['steps_total']} steps "
        + ", ".join(f"{k} {v}" for k, v in steps.items())
        + f" | backward skipped {summary['backward_skipped_pct']:.1f}%",
        f"hybrid: {summary['rollbacks']} rollbacks of {summary['segments_started']} predict segments and "
        f"{summary['jumps_made']} jumps{_restarts(summary)}"
        f" | {summary['nonfinite_steps_skipped']} non-finite and {summary['outlier_steps_skipped']} exploding-gradient"
        f" steps skipped | {summary['backed_off_steps']} steps backed off",
        f"hybrid: wall {summary['wall_time_s']:.1f}s | " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()),
    ]
    if summary.get("jumps_stopped_at") is not None:
        lines.append(
            f"hybrid: jumps stopped at step {summary['jumps_stopped_at']}: training walked them back "
            f"(mean alignment {summary['jump_alignment']:+.3f})"
        )
    return "\n".join(lines)
