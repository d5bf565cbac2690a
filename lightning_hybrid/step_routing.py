"""The per-step mode's dispatch, mixed into the hybrid strategies (:mod:`~lightning_hybrid.strategy`,
:mod:`~lightning_hybrid.fsdp`): a predicted step (no backward pass, the update the plugin's) goes through a
:class:`~lightning_hybrid.engine.StepHandler`, the engine the ``HybridScheduler`` callback attaches in ``setup``.
Every other step reaches the engine from Lightning's hooks, as beside any strategy. A mixin of no Lightning class:
the hybrid strategies put it before theirs."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hybrid.engine.interface import StepHandler
from lightning_hybrid.lightning_packages import MisconfigurationException
from lightning_hybrid.samplers import one_permutation


class StepRouting:
    """What the hybrid strategies add to Lightning's: a predicted step's ``training_step``, ``backward`` and
    ``optimizer_step`` through the attached step handler, and on several ranks one permutation of the data. Any
    other step, and everything outside ``fit`` or without a handler bound to a fit's training (the tuner's trial
    fits, which replace the Trainer's callbacks), is the Lightning parent's own. Mixed in before a Lightning
    strategy class."""

    _hybrid: StepHandler | None = None

    def attach_step_handler(self, handler: StepHandler | None) -> None:
        """Route the predicted steps of ``fit`` through ``handler`` (``None``: plain Lightning again)."""
        self._hybrid = handler

    @property
    def _predicting(self) -> bool:
        return self._hybrid is not None and self._hybrid.bound and self._hybrid.predicting

    @override
    def setup(self, trainer: Any) -> None:
        if trainer.state.fn == "fit" and self._hybrid is None:
            raise MisconfigurationException(
                f"{type(self).__name__} needs the plugin's callback: pass `callbacks=[HybridScheduler()]` (from "
                "lightning_hybrid) to the Trainer, or list `_target_: lightning_hybrid.HybridScheduler` among a "
                "config's callbacks."
            )
        super().setup(trainer)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """On several ranks, every rank its own shard of one permutation, which resumes mid-epoch
        (:func:`~lightning_hybrid.samplers.one_permutation`); on one, the loader as it is."""
        return one_permutation(super().process_dataloader(dataloader))

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().load_checkpoint(checkpoint_path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:  # torch.load's, for damaged files
            raise RuntimeError(
                f"Cannot read the checkpoint {checkpoint_path}: it is truncated, damaged or not a checkpoint "
                f"({type(err).__name__}: {str(err).splitlines()[0]})"
            ) from err

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        run = partial(super().training_step, *args, **kwargs)
        return self._hybrid.training_step(run) if self._predicting else run()

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        run = partial(super().backward, closure_loss, optimizer, *args, **kwargs)
        return self._hybrid.backward(closure_loss, run) if self._predicting else run()

    @override
    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        run = partial(super().optimizer_step, optimizer, model=model, **kwargs)
        return self._hybrid.optimizer_step(optimizer, closure, run) if self._predicting else run(closure)
