"""torch's optimizer step hooks, through which both doors reach a step's update: the update captured where the step
asks for it, the step guarded once its gradients are final (after the caller's clipping: inside Lightning's closure,
or before a loop's ``optimizer.step()``), and a skipped update dropped with its gradients. A quiet step's
``found_inf`` is taken back after the step. The hooks act only while ``acting()`` says the run is on (the callback:
while its fit runs, even where the fit's end never reached the plugin)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch.optim import Optimizer


class StepHooks:
    """The step hooks of ``engine`` (a :class:`~lightning_hybrid.engine.HybridEngine`) on a run's optimizers;
    ``stepped(optimizer)`` runs after each update (a loop ends its step there)."""

    def __init__(self, engine: Any, stepped: Callable[[Optimizer], None] | None = None) -> None:
        self.engine, self.stepped = engine, stepped
        self.optimizers: list[Optimizer] = []
        self._handles: list[Any] = []
        self._acting: Callable[[], bool] = _never

    def attach(self, optimizers: list[Optimizer], acting: Callable[[], bool]) -> None:
        self.optimizers, self._acting = optimizers, acting
        for optimizer in optimizers:
            self._handles += [optimizer.register_step_pre_hook(self._before)]
            self._handles += [optimizer.register_step_post_hook(self._after)]

    def remove(self) -> None:
        """Nothing of the plugin's left on the optimizers, a quiet step's ``found_inf`` a failed step left included."""
        for handle in self._handles:
            handle.remove()
        if self.engine.step_guard is not None:
            for optimizer in self.optimizers:
                self.engine.step_guard.step_done(optimizer)
        self.optimizers, self._handles, self._acting = [], [], _never

    def _before(self, optimizer: Optimizer, args: tuple, kwargs: dict[str, Any]) -> Any:
        if not self._acting():
            return None
        self.engine.before_optimizer_step()
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": partial(_then_guarded, kwargs["closure"], self.engine, optimizer)}
        if len(args) > 1 and callable(args[1]):  # step(closure), positionally
            return (args[0], partial(_then_guarded, args[1], self.engine, optimizer), *args[2:]), kwargs
        _guarded(self.engine, optimizer)
        return None

    def _after(self, optimizer: Optimizer, args: tuple, kwargs: dict[str, Any]) -> None:
        if self._acting():
            self.engine.after_optimizer_step(optimizer)
            if self.stepped is not None:
                self.stepped(optimizer)


def _never() -> bool:
    return False


def _guarded(engine: Any, optimizer: Optimizer) -> None:
    """The step guarded (once a step: Lightning's hook guarded it already) and, where it was skipped, its update
    dropped with its gradients."""
    engine.guard_step()
    engine.drop_skipped(optimizer)


def _then_guarded(closure: Any, engine: Any, optimizer: Optimizer) -> Any:
    """The step's closure (its forward and backward, Lightning's hooks and clipping), then the step guarded, where
    nothing edits its gradients after."""
    output = closure()
    _guarded(engine, optimizer)
    return output
