"""When prediction is allowed at all: the back-off after declined cycles, the learning-rate gate, and the switch
that turns prediction off after repeated failures. Plain Python: every rule is unit-testable without a Trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_hybrid.config import HybridConfig

# why an ordinary step is backed off, as counted in the summary's ``backed_off_by``
SWITCHED_OFF, PAUSED, LEARNING_RATE = "switched_off", "paused", "learning_rate"


class PredictionPolicy:
    """Decides whether ordinary steps observe (capture updates, train the predictor) or are backed off.

    Back-off: after ``backoff_after`` Full cycles in a row end without a segment, observation pauses for
    ``full_steps`` steps; each further declined cycle (until a segment is accepted) starts a pause twice as long, up
    to 32 times. The gate: observation waits until every group's learning rate has decayed to
    ``predict_lr_fraction`` of its peak. After ``max_consecutive_rollbacks`` failed segments in a row, prediction is
    off for the rest of the run.
    """

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        self.declined = 0  # Full cycles in a row that ended without a segment
        self.backoffs = 0  # back-offs since the last accepted segment; each doubles the pause
        self.backoff_until = 0  # no update capture before this global step
        self.lr_peak: list[float] = []  # each group's highest learning rate so far
        self.consecutive_failures = 0
        self.prediction_off = False
        self.gated = True  # the learning-rate gate applies (per-step predictors; trajectory rules are not gated)

    def backed_off(self, global_step: int, lrs: Callable[[], list[float]]) -> str | None:
        """Why an ordinary step starting now skips update capture and predictor training (prediction switched off,
        a pause after declined cycles, the learning rate above the gate), or ``None`` where it observes (``lrs``:
        the groups' learning rates now, asked only where the gate applies)."""
        cfg = self.config
        if not cfg.enable_prediction or self.prediction_off:
            return SWITCHED_OFF
        if global_step < self.backoff_until:
            return PAUSED
        limit = cfg.predict_lr_fraction
        high = self.gated and limit < 1.0 and any(lr > limit * peak for lr, peak in zip(lrs(), self.lr_peak))
        return LEARNING_RATE if high else None

    def start(self, lrs: list[float], gated: bool = True) -> None:
        """Training (re)starts: the learning rates now are the first peak, unless a checkpoint restored one."""
        self.gated = gated
        if not self.lr_peak:
            self.lr_peak = list(lrs)

    def track_peak(self, lrs: list[float]) -> None:
        if self.gated:  # only the gate reads the peaks
            self.lr_peak = [max(peak, lr) for peak, lr in zip(self.lr_peak, lrs)]

    def decline(self, global_step: int) -> None:
        """A Full cycle ended without a segment. Once backed off (and until a segment is accepted), the first
        declined cycle after a pause starts the next, longer one: the predictor has shown it earns no confidence."""
        self.declined += 1
        after = self.config.backoff_after
        if after and (self.declined >= after or self.backoffs > 0):
            self.backoff_until = global_step + self.config.full_steps * 2 ** min(self.backoffs, 5)
            self.backoffs += 1
            self.declined = 0

    def prediction_started(self) -> None:
        """A prediction (a segment or a jump) was made: the cycle was not declined."""
        self.declined = 0

    def prediction_accepted(self) -> None:
        """A prediction (a segment or a jump) was verified and kept."""
        self.consecutive_failures = 0
        self.backoffs = 0

    def prediction_failed(self) -> bool:
        """Count a failed prediction (a segment or a jump); ``True`` when this failure switches prediction off."""
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.config.max_consecutive_rollbacks and not self.prediction_off:
            self.prediction_off = True
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {
            "consecutive_failures": self.consecutive_failures,
            "prediction_off": self.prediction_off,
            "backoff": [self.declined, self.backoffs, self.backoff_until],
            "lr_peak": list(self.lr_peak),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consecutive_failures = int(state["consecutive_failures"])
        self.prediction_off = bool(state["prediction_off"])
        self.declined, self.backoffs, self.backoff_until = (int(v) for v in state["backoff"])
        self.lr_peak = [float(v) for v in state["lr_peak"]]
