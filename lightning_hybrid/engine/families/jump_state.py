"""The ``outer`` jumps' run state: what a checkpoint holds of the family, Python values only, so a run resumes
exactly."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

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
    cycle_lrs: list[float] | None = None  # each group's learning rate where the current cycle started

    def to_dict(self) -> dict[str, Any]:
        """The state as a checkpoint holds it (the anchor, the store's, is added by the family)."""
        values = {k: getattr(self, k) for k in STATE_KEYS[:-2]}
        aligned = {"aligning": self.aligning, "alignments": list(self.alignments), "stopped_at": self.stopped_at}
        return {**values, **aligned, "cycle_lrs": self.cycle_lrs, "window": list(self.window)}

    @classmethod
    def from_dict(cls, state: dict[str, Any], window: int, aligned: int) -> JumpState:
        """The state a checkpoint holds (keys added since version 3 default as before them); ``window`` and
        ``aligned``: the lengths of the verification window and of the alignments kept."""
        rates = state.get("cycle_lrs")
        return cls(
            started=bool(state["started"]),
            jump_due=bool(state["jump_due"]),
            pending=bool(state["pending"]),
            first_check=bool(state["first_check"]),
            reference=float(state["reference"]),
            spread=float(state["spread"]),
            window=deque((float(v) for v in state["window"]), maxlen=window),
            aligning=bool(state.get("aligning", False)),
            alignments=deque((float(v) for v in state.get("alignments", ())), maxlen=aligned),
            stopped_at=int(state.get("stopped_at", -1)),
            cycle_lrs=[float(v) for v in rates] if rates is not None else None,
        )
