"""The phase machine: which phase a step belongs to, how far into it the run is, and how long the next Predict
segment may be. Plain Python, so every transition is unit-testable without a Trainer."""

from __future__ import annotations

from enum import Enum
from typing import Any

from lightning_hybrid.phase import Phase


class Due(Enum):
    """What the machine needs from the engine after a step: a decision it cannot take alone."""

    CYCLE_END = "a Full cycle is complete: start a Predict segment or decline"
    SEGMENT_END = "the Predict segment has applied its last predicted update"
    CORRECTION_END = "the Correct steps after a segment are done"


class PhaseMachine:
    """Warmup → Full → (Predict → Correct → Full)*, counted in optimizer steps.

    The horizon starts at ``max_predict_steps``, halves after every failed segment and doubles, up to
    ``max_predict_steps``, after every accepted one.
    """

    def __init__(self, warmup_steps: int, full_steps: int, correction_steps: int, max_predict_steps: int) -> None:
        self.warmup_steps, self.full_steps, self.correction_steps = warmup_steps, full_steps, correction_steps
        self.max_predict_steps = max_predict_steps
        self.phase = Phase.WARMUP if warmup_steps > 0 else Phase.FULL
        self.phase_step = 0  # ordinary steps done in the current phase (Warmup, Full, Correct)
        self.segment_pos = 0  # predicted steps done in the current segment
        self.horizon = max_predict_steps  # length of the next segment

    @property
    def predicting(self) -> bool:
        return self.phase is Phase.PREDICT

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        self.phase_step = 0

    def start_segment(self) -> None:
        self.segment_pos = 0
        self.enter(Phase.PREDICT)

    def step_done(self, step_phase: Phase, backed_off: bool, segment_length: int) -> Due | None:
        """Count a finished step that began in ``step_phase`` and move on; a step whose phase changed while it ran
        (a rollback) does not count. ``segment_length`` is the running segment's horizon."""
        if self.phase is step_phase and step_phase.ordinary:
            self.phase_step += 1
        if self.phase is Phase.WARMUP and self.phase_step >= self.warmup_steps:
            self.enter(Phase.FULL)
        elif self.phase is Phase.FULL and backed_off:
            self.phase_step = 0  # a fresh Full cycle of observation follows the back-off
        elif self.phase is Phase.FULL and self.phase_step >= self.full_steps:
            self.phase_step = 0  # another Full cycle unless a segment starts
            return Due.CYCLE_END
        elif self.phase is Phase.PREDICT and self.segment_pos >= segment_length:
            self.enter(Phase.CORRECT)
            return Due.SEGMENT_END
        elif self.phase is Phase.CORRECT and self.phase_step >= self.correction_steps:
            self.enter(Phase.FULL)
            return Due.CORRECTION_END
        return None

    def segment_failed(self) -> None:
        """A segment was rolled back or its plan was invalid: try a shorter one next."""
        self.horizon = max(1, self.horizon // 2)

    def segment_accepted(self) -> None:
        self.horizon = min(self.max_predict_steps, self.horizon * 2)

    def state_dict(self) -> dict[str, Any]:
        return {
            "phase": int(self.phase),
            "phase_step": self.phase_step,
            "segment_pos": self.segment_pos,
            "horizon": self.horizon,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase, self.phase_step = Phase(state["phase"]), int(state["phase_step"])
        self.segment_pos, self.horizon = int(state["segment_pos"]), int(state["horizon"])
