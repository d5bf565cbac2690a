"""torch's optimizer step hooks on a fit's optimizers, the two things no Lightning hook is placed for: the update
captured where the step asks for it, and a skipped update dropped after Lightning's clipping (which runs inside the
step's closure; where a gradient scaler steps the optimizer, after clipping, the pre-hook itself is that point).
A quiet step's ``found_inf`` is taken back after the step. The hooks do nothing once the fit is no longer running,
even where its end never reached the plugin (another callback failing in ``on_exception``)."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch.optim import Optimizer


class OptimizerHooks:
    """The step hooks of ``engine`` (a :class:`~lightning_hybrid.engine.HybridEngine`) on a fit's optimizers."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.optimizers: list[Optimizer] = []
        self._handles: list[Any] = []
        self._state: Any = None  # the Trainer's state, read: the hooks act while its fit runs (``_running``)
        self._running: Any = None

    def attach(self, optimizers: list[Optimizer], trainer_state: Any) -> None:
        """From ``on_train_start``, the fit's status running (kept, to compare by identity: Lightning's enums compare
        strings, lowercased, twice a step)."""
        self.optimizers, self._state, self._running = optimizers, trainer_state, trainer_state.status
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
        self.optimizers, self._handles, self._state, self._running = [], [], None, None

    def _acting(self) -> bool:
        return self._state is not None and self._state.status is self._running and self.engine.bound

    def _before(self, optimizer: Optimizer, args: tuple, kwargs: dict[str, Any]) -> Any:
        if not self._acting():
            return None
        self.engine.before_optimizer_step()
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": partial(_then_drop_skipped, kwargs["closure"], self.engine, optimizer)}
        if len(args) > 1 and callable(args[1]):  # step(closure), positionally
            return (args[0], partial(_then_drop_skipped, args[1], self.engine, optimizer), *args[2:]), kwargs
        self.engine.drop_skipped(optimizer)
        return None

    def _after(self, optimizer: Optimizer, args: tuple, kwargs: dict[str, Any]) -> None:
        if self._acting():
            self.engine.after_optimizer_step(optimizer)


def _then_drop_skipped(closure: Any, engine: Any, optimizer: Optimizer) -> Any:
    """The step's closure (its forward and backward, Lightning's hooks and clipping), then the skipped update's
    gradients dropped, where nothing edits them after."""
    output = closure()
    engine.drop_skipped(optimizer)
    return output
