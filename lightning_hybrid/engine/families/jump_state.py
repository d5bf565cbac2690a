"""The ``outer`` jumps' run state: what a checkpoint holds of the family, Python values only, so a run resumes
exactly."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

STATE_KEYS = ("started", "jump_due", "pending", "first_check", "reference", "spread", "window", "anchor")


@dataclass
class JumpState:
    """The family's run state, checkpointed (Python values only, so it resumes exactly)."""

    started: bool = False  # the buffer holds an anchor
    jump_due: bool = False  # the cycle just ended with a jump to make as the next step starts
    pending: bool = False  # a jump awaits its delayed verdict
    first_check: bool = False  # the next ordinary step checks the jump for divergence
    reference: float = math.nan  # the verification window's mean loss in the cycle before the jump
    spread: float = 0.0  # and its losses' standard deviation
    window: deque[float] = field(default_factory=deque)  # this cycle's last losses
    aligning: bool = False  # a jump started this cycle: its alignment is read at the cycle's end
    alignments: deque[float] = field(default_factory=deque)  # the last jumps' alignments
    stopped_at: int = -1  # the global step at which training walked the jumps back and they stopped (-1: not)
