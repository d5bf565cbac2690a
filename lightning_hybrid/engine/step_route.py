"""A step routed through the engine whole, as a :class:`~.interface.StepHandler`: a hybrid strategy's predicted steps
(no backward pass, the update the family's). An ordinary step, in a Trainer or a loop of one's own, goes through the
engine's calls instead: the loss recorded, the step guarded after its backward pass, a skipped update dropped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.optim import Optimizer


class StepRoute:
    """The :class:`~.interface.StepHandler` of ``engine`` (a :class:`~.engine.HybridEngine`)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def bound(self) -> bool:
        return self.engine.bound

    @property
    def predicting(self) -> bool:
        return self.engine.predicting

    def training_step(self, run: Callable[[], Any]) -> Any:
        e = self.engine
        return e.family.predicted_training_step(run) if e.predicting else run()

    def backward(self, loss: Tensor, run: Callable[[], Any]) -> Any:
        e = self.engine
        if e.predicting:  # no backward pass; under manual optimization, the predicted step's forward check
            e.record.add_loss(e.step, loss, True, e.automatic)
            if not e.automatic:  # what the user's training_step does next sees zeros, not no gradient
                e.store.zero_gradients()
            return loss
        e.record_loss(loss)
        return run()

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], run: Callable[..., Any]) -> Any:
        if self.engine.predicting:
            return self.engine.family.predict_step(closure)
        return run(self.guard(closure, optimizer))

    def guard(self, closure: Callable[[], Any], optimizer: Any) -> Callable[[], Any]:
        """Wrap an ordinary step's closure: no non-finite loss or gradient reaches a bound optimizer's weights."""

        def guarded() -> Any:
            output = closure()
            self.engine.guard_step()
            self.engine.drop_skipped(optimizer)
            return output

        return guarded
