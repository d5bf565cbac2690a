"""DivergenceMonitor: decides when a predicted segment has gone wrong."""

from __future__ import annotations

import math
from collections import deque
from itertools import pairwise
from typing import Any

from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.stats import EmaStats
from lightning_hybrid.validation import check_float, check_int

REASONS = ("nonfinite", "bound", "zscore", "oscillation")


class DivergenceMonitor(HybridComponent):
    """Watches losses measured at predicted weights and names the first divergence signal it sees.

    Signals, in order: a NaN/Inf loss; a loss above the predictor's upper bound; a loss whose z-score against the
    warmup/full statistics exceeds ``z_threshold``; and oscillation, i.e. the last ``oscillation_window`` loss
    changes inside the segment alternate in sign and each exceeds ``oscillation_sigmas`` noise deviations.

    Args:
        z_threshold: largest tolerated z-score of a predicted-step loss (> 0).
        oscillation_window: number of alternating loss changes that count as oscillation; 0 disables the signal.
        oscillation_sigmas: size, in loss standard deviations, a change must have to count towards oscillation.
        stats_decay: memory of the moving loss and gradient-norm statistics, in ``[0, 1)``.
        grad_outlier_factor: an ordinary step whose gradient norm exceeds this many times the running mean (once
            10 steps are known) is skipped, so one exploding gradient cannot wreck the optimizer's moments;
            0 disables the check.
    """

    def __init__(
        self,
        z_threshold: float = 4.0,
        oscillation_window: int = 4,
        oscillation_sigmas: float = 1.5,
        stats_decay: float = 0.98,
        grad_outlier_factor: float = 100.0,
    ) -> None:
        owner = "DivergenceMonitor"
        self.z_threshold = check_float(owner, "z_threshold", z_threshold, 0.0, open_low=True)
        self.oscillation_window = check_int(owner, "oscillation_window", oscillation_window, 0)
        self.oscillation_sigmas = check_float(owner, "oscillation_sigmas", oscillation_sigmas, 0.0)
        self.stats_decay = check_float(owner, "stats_decay", stats_decay, 0.0, 1.0 - 1e-12)
        self.grad_outlier_factor = check_float(owner, "grad_outlier_factor", grad_outlier_factor, 0.0)
        self.loss_stats = EmaStats(stats_decay)
        self.grad_norm_stats = EmaStats(stats_decay)
        self.events = {reason: 0 for reason in REASONS}
        self._segment: deque[float] = deque(maxlen=oscillation_window + 1)

    def observe(self, loss: float, grad_norm: float) -> None:
        """Feed a warmup/full step's loss and gradient norm into the reference statistics."""
        if math.isfinite(loss):
            self.loss_stats.update(loss)
        if math.isfinite(grad_norm):
            self.grad_norm_stats.update(grad_norm)

    def gradient_outlier(self, grad_norm: float) -> bool:
        """Whether an ordinary step's gradient norm is an explosion, not training (see ``grad_outlier_factor``)."""
        stats = self.grad_norm_stats
        limit = self.grad_outlier_factor * stats.mean
        return self.grad_outlier_factor > 0 and stats.count >= 10 and limit > 0 and grad_norm > limit

    def start_segment(self) -> None:
        self._segment.clear()

    def check(self, loss: float, upper_bound: float) -> str | None:
        """Return the divergence reason for a loss measured at predicted weights, or ``None`` if it looks fine."""
        reason = self._reason(loss, upper_bound)
        if reason is not None:
            self.events[reason] += 1
        return reason

    def _reason(self, loss: float, upper_bound: float) -> str | None:
        if not math.isfinite(loss):
            return "nonfinite"
        if loss > upper_bound:
            return "bound"
        std = self.loss_stats.std
        if std > 0 and (loss - self.loss_stats.mean) / std > self.z_threshold:
            return "zscore"
        self._segment.append(loss)
        return "oscillation" if self._oscillating(std) else None

    def _oscillating(self, std: float) -> bool:
        if self.oscillation_window == 0 or len(self._segment) <= self.oscillation_window:
            return False
        values = list(self._segment)
        changes = [b - a for a, b in pairwise(values)]
        alternating = all(c1 * c2 < 0 for c1, c2 in pairwise(changes))
        return alternating and all(abs(c) > self.oscillation_sigmas * std for c in changes)

    def _state(self) -> dict[str, Any]:
        return {
            "loss_stats": self.loss_stats.state_dict(),
            "grad_norm_stats": self.grad_norm_stats.state_dict(),
            "events": dict(self.events),
            "segment": list(self._segment),
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.loss_stats.load_state_dict(state["loss_stats"])
        self.grad_norm_stats.load_state_dict(state["grad_norm_stats"])
        self.events = {reason: int(state["events"].get(reason, 0)) for reason in REASONS}
        self._segment = deque(state["segment"], maxlen=self.oscillation_window + 1)
