"""The four phases of hybrid predictive training."""

from __future__ import annotations

from enum import IntEnum


class Phase(IntEnum):
    """Phase codes; the integer is what ``hybrid/phase`` logs."""

    WARMUP = 0
    FULL = 1
    PREDICT = 2
    CORRECT = 3

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def ordinary(self) -> bool:
        """Whether steps in this phase run a real backward pass and optimizer step."""
        return self is not Phase.PREDICT


_LABELS = {phase: phase.name.lower() for phase in Phase}  # asked at every step: built once
