"""The two small contracts between Lightning and the engine, defined below both so neither imports the other.

A hybrid strategy hands each training step to a :class:`StepHandler`; the engine asks the strategy for the
collective and shard operations of :class:`Collectives`. The strategy knows only these protocols, the callbacks know
the strategy, and the engine knows neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.optim import Optimizer


@runtime_checkable
class StepHandler(Protocol):
    """What a hybrid strategy routes ``training_step``, ``backward`` and ``optimizer_step`` through. Each call gets
    the strategy's own implementation as ``run``, to call (ordinary steps) or leave out (predicted ones)."""

    @property
    def bound(self) -> bool:
        """Whether a fit's training is under way with this handler (its optimizer taken): only then are steps
        routed through it. A fit run by another set of callbacks (the LR finder's and the batch-size finder's
        trial fits) trains as plain Lightning."""

    def training_step(self, run: Callable[[], Any]) -> Any:
        """``run()`` calls the module's ``training_step``."""

    def backward(self, loss: Tensor, run: Callable[[], Any]) -> Any:
        """``run()`` runs the backward pass of ``loss``."""

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], run: Callable[..., Any]) -> Any:
        """``run(closure)`` steps ``optimizer`` with ``closure`` (the forward and backward, in automatic
        optimization), through Lightning's precision plugin."""

    def clipping_norm(self, params: list[Tensor]) -> Tensor | None:
        """The total norm of ``params``' gradients, where the handler measured it this step as clipping would
        (bitwise), so that clipping need not take it again; ``None`` otherwise."""

    def evaluate(self, on: bool) -> bool:
        """Put in the parameters what the run is evaluated at (``on``: a checkpoint is written), or take it back out;
        returns whether they changed."""


@runtime_checkable
class Collectives(Protocol):
    """What the engine needs from the strategy to work on this rank's part of the parameters."""

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


class LocalCollectives:
    """:class:`Collectives` of a single process: what the engine uses when it runs without a Trainer."""

    sharded = False

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.root_device = torch.device(device)

    def local_tensor(self, tensor: Tensor) -> Tensor:
        return tensor

    def sum_across_ranks(self, tensor: Tensor) -> Tensor:
        return tensor

    def reduce(self, tensor: Tensor, group: Any = None, reduce_op: str | None = "mean") -> Tensor:
        return tensor

    def parameters_changed(self) -> None:
        pass
