"""Several optimizers that step on one loss (Muon for the hidden matrices beside AdamW for the rest, say), seen by
the engine as one: their parameters are one trajectory, with one anchor, one jump, one verdict and one guard a
step. Plain torch: the engine and its store read ``param_groups`` and call ``zero_grad`` as they would on one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.optim import Optimizer


class OptimizerSet:
    """The optimizers of one step, in the order the module returned them.

    ``param_groups`` is every optimizer's groups in turn, so the store's tensors and learning rates follow that
    order (a checkpoint resumes with the same order); a skip (``zero_grad``) reaches every one; a step can be
    skipped on the device only when every optimizer takes a ``found_inf`` (torch's fused Adam, AdamW, SGD).
    """

    def __init__(self, optimizers: Sequence[Optimizer]) -> None:
        if len(optimizers) < 2:
            raise ValueError(f"OptimizerSet: needs at least two optimizers, got {len(optimizers)}")
        self.optimizers = list(optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def _step_supports_amp_scaling(self) -> bool:
        return all(getattr(optimizer, "_step_supports_amp_scaling", False) for optimizer in self.optimizers)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)


def members(optimizer: Any) -> Sequence[Optimizer]:
    """The optimizers behind what the engine was bound to: a set's, or the one."""
    return getattr(optimizer, "optimizers", (optimizer,))
