"""DivergenceCheck: decides when a predicted segment or a jump has gone wrong, in plain Python (the
:class:`~lightning_hybrid.DivergenceMonitor` callback holds one and checkpoints it)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from lightning_hybrid.settings import CYCLES, EVERY_MODE, PER_STEP, Float, Int, Settings, setting
from lightning_hybrid.stats import EmaStats

REASONS = ("nonfinite", "bound", "zscore", "oscillation", "delayed")


@dataclass(eq=False)
class DivergenceCheck(Settings):
    """Watches losses measured at predicted weights and names the first divergence signal it sees.

    Signals, in order: a NaN/Inf loss; a loss above the predictor's upper bound; a loss whose z-score against the
    warmup/full statistics exceeds ``z_threshold``; and oscillation, i.e. the last ``oscillation_window`` loss
    changes inside the segment alternate in sign and each exceeds ``oscillation_sigmas`` noise deviations.

    A jump of the default rule (``outer``) is judged twice: on the first ordinary step after it, only for divergence
    (a non-finite loss or a z-score above ``z_threshold``), and at the end of the next cycle by the delayed verdict,
    whose settings are the rule's (:class:`~lightning_hybrid.predictors.OuterMomentum`); both are counted here.
    """

    owner = "DivergenceMonitor"  # the name users configure it by

    z_threshold: float = setting(
        4.0,
        "largest tolerated z-score of a loss against the run's statistics: beyond it a predicted step ends its "
        "segment, and the step after a jump undoes the jump at once",
        Float(0.0, open_low=True),
        reads=CYCLES,
    )
    oscillation_window: int = setting(
        4,
        "alternating loss changes inside a segment that count as oscillation; 0 disables the signal",
        Int(0),
        reads=PER_STEP,
    )
    oscillation_sigmas: float = setting(
        1.5, "size, in loss deviations, of a change that counts towards oscillation", Float(0.0), reads=PER_STEP
    )
    stats_decay: float = setting(
        0.98,
        "memory of the moving loss and gradient-norm statistics",
        Float(0.0, 1.0, open_high=True),
        reads=CYCLES,
    )
    grad_outlier_factor: float = setting(
        100.0,
        "an ordinary step whose gradient norm exceeds this many times the running mean (once 10 steps are known) is "
        "skipped, so one exploding gradient cannot wreck the optimizer's moments; 0 disables the check",
        Float(0.0),
        reads=EVERY_MODE,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.loss_stats = EmaStats(self.stats_decay)
        self.grad_norm_stats = EmaStats(self.stats_decay)
        self.events = {reason: 0 for reason in REASONS}
        self._segment: deque[float] = deque(maxlen=self.oscillation_window + 1)

    def observe(self, loss: float, grad_norm: float) -> None:
        """Feed a warmup/full step's loss and gradient norm into the reference statistics."""
        if math.isfinite(loss):
            self.loss_stats.update(loss)
        if math.isfinite(grad_norm):
            self.grad_norm_stats.update(grad_norm)

    def gradient_outlier(self, grad_norm: float) -> bool:
        """Whether an ordinary step's gradient norm is an explosion, not training (see ``grad_outlier_factor``)."""
        return grad_norm > self.outlier_limit()

    def outlier_limit(self) -> float:
        """The gradient norm above which a step is an outlier now (``inf`` while the check is off or unprimed)."""
        stats = self.grad_norm_stats
        limit = self.grad_outlier_factor * stats.mean
        return limit if self.grad_outlier_factor > 0 and stats.count >= 10 and limit > 0 else math.inf

    def start_segment(self) -> None:
        self._segment.clear()

    def check(self, loss: float, upper_bound: float) -> str | None:
        """Return the divergence reason for a loss measured at predicted weights, or ``None`` if it looks fine."""
        reason = self._reason(loss, upper_bound)
        if reason is not None:
            self.events[reason] += 1
        return reason

    def diverged(self, loss: float) -> str | None:
        """The check right after a jump: only divergence (non-finite, or a z-score above ``z_threshold``)."""
        reason = None
        if not math.isfinite(loss):
            reason = "nonfinite"
        elif self._z_score(loss) > self.z_threshold:
            reason = "zscore"
        if reason is not None:
            self.events[reason] += 1
        return reason

    def judge_window(self, before: float, after: float, tolerance: float) -> str | None:
        """The delayed verdict on a jump: ``after`` is the mean loss of the verification window after it, ``before``
        the same window's mean in the cycle before it. The jump is kept when, once the optimizer has settled, the
        loss is no higher than before it, within ``tolerance`` (the rule's, from the windows' spread). A linear
        extrapolation of earlier windows' progress would expect too much on a loss curve that flattens (measured on
        the river-valley test: it rejected a jump that paid), and a cycle's progress is small against batch noise
        on real tasks."""
        reason = "nonfinite" if not math.isfinite(after) else "delayed" if after > before + tolerance else None
        if reason is not None:
            self.events[reason] += 1
        return reason

    def _z_score(self, loss: float) -> float:
        std = self.loss_stats.std
        return (loss - self.loss_stats.mean) / std if std > 0 else 0.0

    def _reason(self, loss: float, upper_bound: float) -> str | None:
        if not math.isfinite(loss):
            return "nonfinite"
        if loss > upper_bound:
            return "bound"
        if self._z_score(loss) > self.z_threshold:
            return "zscore"
        self._segment.append(loss)
        return "oscillation" if self._oscillating(self.loss_stats.std) else None

    def _oscillating(self, std: float) -> bool:
        if self.oscillation_window == 0 or len(self._segment) <= self.oscillation_window:
            return False
        values = list(self._segment)
        changes = [b - a for a, b in pairwise(values)]
        alternating = all(c1 * c2 < 0 for c1, c2 in pairwise(changes))
        return alternating and all(abs(c) > self.oscillation_sigmas * std for c in changes)

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss_stats": self.loss_stats.state_dict(),
            "grad_norm_stats": self.grad_norm_stats.state_dict(),
            "events": dict(self.events),
            "segment": list(self._segment),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_stats.load_state_dict(state["loss_stats"])
        self.grad_norm_stats.load_state_dict(state["grad_norm_stats"])
        self.events = {reason: int(state["events"].get(reason, 0)) for reason in REASONS}
        self._segment = deque(state["segment"], maxlen=self.oscillation_window + 1)
