"""``average``: generalized primal averaging on top of the user's optimizer, a trajectory rule that holds one
parameter copy (the average), which validation, checkpoints and the end of ``fit`` see."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.offload import host_copies
from lightning_hybrid.predictors.rules import TensorList, TrajectoryRule, load_into
from lightning_hybrid.validation import check_float


class PrimalAverage(TrajectoryRule):
    """``average``: generalized primal averaging on top of the user's optimizer.

    The optimizer's own sequence ``z`` takes its steps from gradients computed at
    ``y = average_y * x + (1 - average_y) * z``, and the averaged sequence ``x <- average_x * x + (1 - average_x) * z``
    is the model that validation, checkpoints and the end of ``fit`` see (as with Lightning's weight-averaging
    callbacks). The trained parameters hold ``y`` between steps; ``z`` is recomputed from ``y`` and ``x`` just
    before each optimizer step, so the rule holds one parameter copy (``x``). No backward pass is added or skipped.
    ``average_x`` of 0.9934 / 0.9967 / 0.9984 corresponds to DiLoCo with 16 / 32 / 64 inner steps.

    Args:
        average_x: μ_x, the weight of the old average per step, in ``[0, 1)``.
        average_y: μ_y, where gradients are taken between the average and the optimizer's sequence, in ``[0, 1)``.
    """

    name = "average"
    family = "averaging"

    def __init__(self, average_x: float = 0.9869, average_y: float = 0.7) -> None:
        self.average_x = check_float("PrimalAverage", "average_x", average_x, 0.0, 1.0 - 1e-12)
        self.average_y = check_float("PrimalAverage", "average_y", average_y, 0.0, 1.0 - 1e-12)
        super().__init__()
        self._x: list[Tensor] = []

    def setup(self, params: TensorList, keep_jump: bool) -> None:
        self._x = [p.detach().clone() for p in params]
        self._apply_pending()

    @property
    def average(self) -> list[Tensor]:
        return self._x

    def restart(self, params: TensorList) -> None:
        """Averaging starts (after warmup): ``x = y = z`` at the current weights."""
        with torch.no_grad():
            torch._foreach_copy_(self._x, list(params))

    def to_optimizer_sequence(self, params: list[Tensor]) -> None:
        """After the backward pass, before the update: ``params`` (``y``) become ``z = (y - μ_y x) / (1 - μ_y)``."""
        if self.average_y == 0:
            return
        with torch.no_grad():
            torch._foreach_add_(params, self._x, alpha=-self.average_y)
            torch._foreach_div_(params, 1.0 - self.average_y)

    def to_gradient_point(self, params: list[Tensor]) -> None:
        """After the optimizer step on ``z``: fold it into ``x``, then move ``params`` to ``y``."""
        with torch.no_grad():
            torch._foreach_lerp_(self._x, params, 1.0 - self.average_x)
            if self.average_y > 0:
                torch._foreach_lerp_(params, self._x, self.average_y)

    def back_to_gradient_point(self, params: list[Tensor]) -> None:
        """Undo :meth:`to_optimizer_sequence` when no update followed (``y = μ_y x + (1 - μ_y) z``)."""
        if self.average_y > 0:
            with torch.no_grad():
                torch._foreach_lerp_(params, self._x, self.average_y)

    def release(self) -> None:
        if self._x:
            self._released, self._x = self.state_dict(), []

    def state_dict(self) -> dict[str, Any]:
        if not self._x:
            return self._parked({"x": []})
        return {"x": host_copies(self._x)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._x:
            self._park(state)
            return
        load_into("PrimalAverage", "average", self._x, state["x"])
