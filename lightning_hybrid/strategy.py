"""The hybrid strategies of the per-step mode: ``lightning.pytorch``'s single-device and DDP strategies with the
plugin's step routing (:class:`~lightning_hybrid.step_routing.StepRouting`): predicted steps go through the engine,
and on several ranks a shuffled ``StatefulDataLoader`` gets one permutation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from typing_extensions import override

from lightning_hybrid.lightning_packages import MisconfigurationException
from lightning_hybrid.step_routing import StepRouting

if TYPE_CHECKING:
    import lightning.pytorch as pl


class HybridPredictStrategy(StepRouting, SingleDeviceStrategy):
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


class HybridDDPStrategy(StepRouting, DDPStrategy):
    """Hybrid predictive training with DistributedDataParallel (``strategy="hybrid_ddp"``).

    Every phase decision uses losses averaged over ranks and gradients DDP has already all-reduced, so all ranks
    take the same decisions and keep bitwise-identical parameters. Takes the arguments of
    :class:`~lightning.pytorch.strategies.DDPStrategy`.
    """

    strategy_name = "hybrid_ddp"
