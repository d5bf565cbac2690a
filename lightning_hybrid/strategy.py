"""Hybrid strategies: Lightning's single-device and DDP strategies with the step dispatch routed through a
:class:`~lightning_hybrid.engine.StepHandler` (the engine the ``HybridScheduler`` callback attaches in ``setup``).

The strategy knows only that protocol; it also offers the engine the :class:`~lightning_hybrid.engine.Collectives`
it needs (this rank's part of a tensor, sums over ranks, a notice after in-place changes)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hybrid.engine.interface import StepHandler
from lightning_hybrid.samplers import one_permutation

if TYPE_CHECKING:
    import lightning.pytorch as pl


class StepRouting(Strategy):
    """Overrides ``training_step``, ``backward`` and ``optimizer_step`` of a Lightning strategy, and what the run is
    evaluated and checkpointed at: what the plugin adds to any strategy. The hybrid strategies are Lightning's with
    it; a strategy the user chose gets it from the ``HybridScheduler`` for the fit (:mod:`~.adopted`).

    Outside ``fit`` (``validate``, ``test``, ``predict``), without an attached step handler, and while the handler
    is not bound to a fit's training (the tuner's trial fits, which replace the Trainer's callbacks), the strategy
    behaves exactly like its Lightning parent. A subclass of Lightning's ``Strategy``, so that a strategy instance
    can take it as a subclass of its own class (an instance's class may change only to one of the same layout).
    """

    _hybrid: StepHandler | None = None
    sharded = False  # whether each rank holds only shards of the parameters (FSDP)

    def attach_step_handler(self, handler: StepHandler | None) -> None:
        """Route the steps of ``fit`` through ``handler`` (``None``: plain Lightning again)."""
        self._hybrid = handler

    def local_tensor(self, tensor: Tensor) -> Tensor:
        """The part of a parameter (or gradient) this rank holds and updates."""
        return tensor

    def sum_across_ranks(self, tensor: Tensor) -> Tensor:
        """Sum a statistic of local tensors over the ranks; replicated parameters need no reduction."""
        return tensor

    def parameters_changed(self) -> None:
        """Called after the scheduler changed parameters in place outside an optimizer step."""

    def _require_scheduler(self, trainer: pl.Trainer) -> None:
        if trainer.state.fn == TrainerFn.FITTING and self._hybrid is None:
            raise MisconfigurationException(
                f"{type(self).__name__} needs the plugin's callback: pass `callbacks=[HybridScheduler()]` (from "
                "lightning_hybrid) to the Trainer, or list `_target_: lightning_hybrid.HybridScheduler` among a "
                "config's callbacks."
            )

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self._require_scheduler(trainer)
        self._clip_only_present_gradients()
        super().setup(trainer)

    def _clip_only_present_gradients(self) -> None:
        """A skipped step drops its gradients and a predicted step has none; torch's value clipping fails on an
        empty gradient list, so Lightning's clipping (automatic, or ``self.clip_gradients`` in a manual
        ``training_step``) becomes a no-op when no parameter holds a gradient. Clipping by norm takes the norm the
        guard took this step where it can (:func:`_clip_by_norm`). The precision plugin is Lightning's own class,
        chosen by the Trainer, so its two methods are wrapped on this instance (partials of module functions: the
        strategy still pickles)."""
        plugin = self.precision_plugin
        if not isinstance(plugin.__dict__.get("clip_gradients"), partial):
            plugin.clip_gradients = partial(_clip_present_gradients, plugin)
            plugin.clip_grad_by_norm = partial(_clip_by_norm, plugin, self)

    @override
    def on_validation_start(self) -> None:
        """Validation inside ``fit`` sees what the run is evaluated at (an averaging rule's average), from here (the
        last of Lightning's validation-start hooks) to :meth:`on_validation_end` (the last of the end hooks, so a
        checkpoint saved by a callback there holds it too)."""
        super().on_validation_start()
        if self._hybrid is not None:
            self._hybrid.evaluate(True)

    @override
    def on_validation_end(self) -> None:
        if self._hybrid is not None:
            self._hybrid.evaluate(False)
        super().on_validation_end()

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Write the weights the run is evaluated at (an averaging rule's average): the checkpoint's state dict
        holds the parameters' own tensors, so they are put in place while it is written, and taken out after."""
        swapped = self._hybrid is not None and self._hybrid.evaluate(True)
        try:
            super().save_checkpoint(checkpoint, filepath, storage_options)
        finally:
            if swapped:
                self._hybrid.evaluate(False)

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

    @property
    def _routing(self) -> bool:
        return self._hybrid is not None and self._hybrid.bound

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        run = partial(super().training_step, *args, **kwargs)
        return self._hybrid.training_step(run) if self._routing else run()

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        run = partial(super().backward, closure_loss, optimizer, *args, **kwargs)
        return self._hybrid.backward(closure_loss, run) if self._routing else run()

    @override
    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        run = partial(super().optimizer_step, optimizer, model=model, **kwargs)
        return self._hybrid.optimizer_step(optimizer, closure, run) if self._routing else run(closure)


class HybridStrategyMixin(StepRouting):
    """The hybrid strategies' own: the plugin's step routing, and on several ranks one permutation of the data."""

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """On several ranks, every rank its own shard of one permutation, which resumes mid-epoch
        (:func:`~lightning_hybrid.samplers.one_permutation`); on one, the loader as it is."""
        return one_permutation(super().process_dataloader(dataloader))


def _clip_present_gradients(
    plugin: Any, optimizer: Optimizer, clip_val: float = 0.0, *args: Any, **kwargs: Any
) -> None:
    """The precision plugin's own ``clip_gradients``, where a parameter holds a gradient. Without a positive
    ``clip_val`` Lightning's does nothing: the parameters are not looked through at every step."""
    if clip_val > 0 and any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
        type(plugin).clip_gradients(plugin, optimizer, clip_val, *args, **kwargs)


def _clip_by_norm(plugin: Any, routing: StepRouting, optimizer: Optimizer, clip_val: float) -> None:
    """The precision plugin's own ``clip_grad_by_norm``, with the gradients' total norm the step handler took this
    step where it has it: torch's ``clip_grads_with_norm_`` then scales them as ``clip_grad_norm_`` would, bitwise,
    without a second pass over them to measure."""
    own, handler = type(plugin).clip_grad_by_norm, routing._hybrid
    with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)  # torch 2.6 and later
    if handler is not None and with_norm is not None and own is Precision.clip_grad_by_norm:
        params = list(plugin.main_params(optimizer))
        if (total := handler.clipping_norm(params)) is not None:
            with_norm(params, clip_val, total)
            return
    own(plugin, optimizer, clip_val)


class HybridPredictStrategy(HybridStrategyMixin, SingleDeviceStrategy):
    """Hybrid predictive training on one device (``strategy="hybrid"``).

    Args:
        device: the device to train on; by default the one the Trainer's ``accelerator``/``devices`` select.
        **kwargs: passed to :class:`~lightning.pytorch.strategies.SingleDeviceStrategy`.
    """

    strategy_name = "hybrid"

    def __init__(self, device: str | torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(device=device if device is not None else "cpu", **kwargs)
        self._device_given = device is not None
        # The Trainer's accelerator connector fills this attribute with the devices it selected.
        self.parallel_devices: list[torch.device] | None = None

    @property
    @override
    def root_device(self) -> torch.device:
        if not self._device_given and self.parallel_devices:
            first = self.parallel_devices[0]  # the connector's torch.device: not built again at each call
            return first if isinstance(first, torch.device) else torch.device(first)
        return self._root_device

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        if not self._device_given and self.parallel_devices and len(self.parallel_devices) > 1:
            raise MisconfigurationException(
                f"HybridPredictStrategy trains on one device but the Trainer selected {len(self.parallel_devices)}; "
                'use `strategy="hybrid_ddp"` (HybridDDPStrategy) for several.'
            )
        super().setup(trainer)


class HybridDDPStrategy(HybridStrategyMixin, DDPStrategy):
    """Hybrid predictive training with DistributedDataParallel (``strategy="hybrid_ddp"``).

    Every phase decision uses losses averaged over ranks and gradients DDP has already all-reduced, so all ranks
    take the same decisions and keep bitwise-identical parameters. Takes the arguments of
    :class:`~lightning.pytorch.strategies.DDPStrategy`.
    """

    strategy_name = "hybrid_ddp"
