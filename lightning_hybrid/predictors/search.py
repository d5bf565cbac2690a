"""``search``: a probe-verified line search along the optimizer's last update (Fast Forward, Rahamim et al. 2024),
or along the mean update of the last ``span`` steps, whose minibatch noise partly cancels.

After an ordinary update ``d`` (or that mean), the search repeats it while the loss on a fixed probe falls: each
repetition is kept only if the probe's loss at the new point is below its loss at the point before, the same
batches compared with and without the step. The repetition that does not lower it is undone exactly (the weights go
back to the last kept point, bitwise), so a search that finds nothing leaves the weights untouched. No backward
pass is added or skipped; each probe evaluation is a forward pass over the probe's batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.predictors.rules import TrajectoryRule
from lightning_hybrid.validation import check_int


class LineSearch(TrajectoryRule):
    """The search and its schedule (the ``search`` family runs it; see ``docs/how-it-works.md``).

    Args:
        every: ordinary steps between searches while they pay (≥ 1).
        max_interval: the longest gap between searches: each search that keeps no step doubles the gap, up to this
            (≥ ``every``); one that keeps a step brings it back to ``every``. A run where the search never pays
            spends about two probe evaluations every ``max_interval`` steps.
        max_steps: the most repetitions one search keeps (≥ 1).
        probe_batches: how many of the run's first training batches form the probe (≥ 1); they are held for the
            run and checkpointed with it.
        span: the direction searched is the mean update of the last ``span`` ordinary steps (1: the last update).
            Above 1, the weights at the span's start are held (one parameter copy, checkpointed) until the search;
            at most ``every``, so that a span holds no earlier search's steps.
    """

    name = "search"
    family = "search"

    def __init__(
        self, every: int = 6, max_interval: int = 256, max_steps: int = 16, probe_batches: int = 1, span: int = 1
    ) -> None:
        owner = "LineSearch"
        self.every = check_int(owner, "every", every, 1)
        self.max_interval = check_int(owner, "max_interval", max_interval, every)
        self.max_steps = check_int(owner, "max_steps", max_steps, 1)
        self.probe_batches = check_int(owner, "probe_batches", probe_batches, 1)
        self.span = check_int(owner, "span", span, 1)
        if span > every:
            raise ValueError(f"{owner}: `span` must be an integer in [1, every={every}], got {span!r}")

    def setup(self, params: Sequence[Tensor], keep_jump: bool) -> None:
        """Nothing to allocate: the search borrows the update's buffer and holds a copy only while it runs."""

    def search(self, params: list[Tensor], direction: list[Tensor], loss: Callable[[], float]) -> tuple[int, float]:
        """Add ``direction`` to ``params`` while ``loss()`` (the probe's, at the current weights) falls; return how
        many additions were kept and the probe's loss before the first. ``params`` end at the last kept point."""
        with torch.no_grad():
            before = best = loss()
            kept = torch._foreach_mul(params, 1.0)  # the last kept point, to return to exactly
            taken = 0
            while taken < self.max_steps:
                torch._foreach_add_(params, direction)
                now = loss()
                if not now < best:  # higher, equal or not finite: undo this one and stop
                    torch._foreach_copy_(params, kept)
                    break
                best, taken = now, taken + 1
                if taken < self.max_steps:
                    torch._foreach_copy_(kept, params)
        return taken, before

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
