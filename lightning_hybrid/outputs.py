"""The contract for ``training_step``'s output on predicted steps, for callbacks that read step outputs.

On a predicted step without a forward pass the module's ``training_step`` does not run, so ``outputs`` in
``on_train_batch_end`` is ``{"loss": <the predicted loss>, "hybrid_predicted": True}`` and holds none of the
module's own keys. On a predicted step that ran a forward check, ``outputs`` is the module's own output (a tensor
becomes ``{"loss": tensor}``) with ``"hybrid_predicted": True`` added. Ordinary steps are untouched. A callback
that reads its own keys checks :func:`is_predicted_step` first::

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if is_predicted_step(outputs):
            return
        self.metric.update(outputs["preds"], batch[1])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

PREDICTED_STEP_KEY = "hybrid_predicted"


def is_predicted_step(outputs: Any) -> bool:
    """Whether ``outputs`` (as Lightning hands it to ``on_train_batch_end``) comes from a predicted step."""
    return isinstance(outputs, Mapping) and outputs.get(PREDICTED_STEP_KEY) is True


def mark_predicted(output: Any) -> Any:
    """A predicted step's ``training_step`` output, marked: a mapping gains the key, a tensor becomes a dict."""
    if isinstance(output, Tensor):
        return {"loss": output, PREDICTED_STEP_KEY: True}
    if isinstance(output, Mapping):
        return {**output, PREDICTED_STEP_KEY: True}
    return output  # None: the module skipped the batch


def loss_of(output: Any) -> Tensor | None:
    """The loss inside a ``training_step`` output (a tensor, a dict with ``"loss"``, or ``None``)."""
    if isinstance(output, Mapping):
        output = output.get("loss")
    return output.detach().float() if isinstance(output, Tensor) else None
