"""The two small contracts between the engine and what runs it, defined below both so neither imports the other.

A hybrid strategy hands each predicted step to a :class:`StepHandler`; the engine asks for the collective and shard
operations of :class:`Collectives` (:mod:`~.collectives`: torch's, and the scheduler's from the Trainer's strategy).
The strategy knows only these protocols, and the engine knows neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.optim import Optimizer


@runtime_checkable
class StepHandler(Protocol):
    """What a hybrid strategy routes ``training_step``, ``backward`` and ``optimizer_step`` through while the step is
    predicted (an ordinary step reaches the engine from Lightning's hooks). Each call gets the strategy's own
    implementation as ``run``, to call (ordinary steps) or leave out (predicted ones)."""

    @property
    def bound(self) -> bool:
        """Whether a fit's training is under way with this handler (its optimizer taken). A fit run by another set
        of callbacks (the LR finder's and the batch-size finder's trial fits) trains as plain Lightning."""

    @property
    def predicting(self) -> bool:
        """Whether the step now running is predicted: no backward pass, the update the handler's."""

    def training_step(self, run: Callable[[], Any]) -> Any:
        """``run()`` calls the module's ``training_step``."""

    def backward(self, loss: Tensor, run: Callable[[], Any]) -> Any:
        """``run()`` runs the backward pass of ``loss``."""

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], run: Callable[..., Any]) -> Any:
        """``run(closure)`` steps ``optimizer`` with ``closure`` (the forward and backward, in automatic
        optimization), through Lightning's precision plugin."""


@runtime_checkable
class Collectives(Protocol):
    """What the engine needs of the run's ranks to work on this rank's part of the parameters."""

    sharded: bool  # whether each rank holds only shards of the parameters (``local_tensor`` is not the identity)

    @property
    def root_device(self) -> torch.device: ...

    def local_tensor(self, tensor: Tensor) -> Tensor:
        """The part of a parameter (or gradient) this rank holds and updates."""

    def sum_across_ranks(self, tensor: Tensor) -> Tensor:
        """Sum a statistic of local tensors over the ranks (identity where parameters are replicated)."""

    def reduce(self, tensor: Tensor, group: Any = None, reduce_op: str | None = "mean") -> Tensor:
        """Lightning's ``Strategy.reduce``."""

    def parameters_changed(self) -> None:
        """The engine changed parameters in place outside an optimizer step."""
