"""ProbeLoss: the probe a family such as ``search`` reads, on the Lightning side: a few training batches held from
the run's first steps, and the module's own loss on them at the current weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import Tensor

from lightning_hybrid.outputs import loss_of


def _on_host(batch: Any) -> Any:
    return apply_to_collection(batch, Tensor, lambda t: t.detach().to("cpu", copy=True))


@contextlib.contextmanager
def _silent(module: pl.LightningModule) -> Iterator[None]:
    """The module's ``self.log`` calls do nothing: a probe's losses are not the run's training losses."""
    module.__dict__["log"] = module.__dict__["log_dict"] = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del module.__dict__["log"], module.__dict__["log_dict"]


class ProbeLoss:
    """The first ``size`` training batches of the run, kept on the host (and in the checkpoint), and the mean of
    the module's ``training_step`` loss over them: in eval mode (no dropout, BatchNorm's statistics untouched),
    without gradients, in the Trainer's precision, with ``self.log`` silenced, averaged over ranks so that every rank
    decides alike. A ``training_step`` that updates metrics of its own counts the probe's batches too.

    Args:
        size: how many batches the probe holds.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.batches: list[Any] = []
        self._trainer: pl.Trainer | None = None

    def attach(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer

    def offer(self, batch: Any) -> None:
        """A training batch as its step starts: kept while the probe is not full."""
        if len(self.batches) < self.size:
            self.batches.append(_on_host(batch))

    @property
    def ready(self) -> bool:
        return len(self.batches) >= self.size

    def loss(self) -> float:
        trainer = self._trainer
        module, strategy = trainer.lightning_module, trainer.strategy
        training = module.training
        module.eval()
        try:
            with torch.no_grad(), trainer.precision_plugin.forward_context(), _silent(module):
                losses = []
                for i, batch in enumerate(self.batches):
                    loss = loss_of(module.training_step(strategy.batch_to_device(batch), i))
                    losses.append(loss if loss is not None else torch.tensor(float("nan")))
        finally:
            module.train(training)
        mean = torch.stack([loss.to(strategy.root_device) for loss in losses]).mean()
        return float(strategy.reduce(mean, reduce_op="mean"))

    def state_dict(self) -> dict[str, Any]:
        return {"batches": list(self.batches)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = list(state["batches"])[: self.size]
