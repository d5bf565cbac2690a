"""RunMeter: what a fair comparison with plain Lightning needs, measured the same way for both runs."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class RunMeter(Callback):
    """Counts backward passes (``on_before_backward``, which plain and hybrid training both call once per backward)
    and measures training time with validation excluded, as wall time and as this process's CPU time (all
    threads), which other load on a shared machine distorts far less."""

    def __init__(self) -> None:
        self.backward_passes = 0
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0
        self._wall0 = self._cpu0 = 0.0
        self._running = self._paused = False

    def _start(self) -> None:
        self._wall0, self._cpu0, self._running = time.perf_counter(), time.process_time(), True

    def _stop(self) -> None:
        if self._running:
            self.train_seconds += time.perf_counter() - self._wall0
            self.train_cpu_seconds += time.process_time() - self._cpu0
            self._running = False

    def elapsed(self) -> tuple[float, float]:
        """Training time so far as ``(wall, CPU)`` seconds, the interval now running included."""
        if not self._running:
            return self.train_seconds, self.train_cpu_seconds
        return (
            self.train_seconds + time.perf_counter() - self._wall0,
            self.train_cpu_seconds + time.process_time() - self._cpu0,
        )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._running:  # validation inside fit: pause the training clock
            self._stop()
            self._paused = True

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._paused:
            self._paused = False
            self._start()

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self.backward_passes += 1

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "backward_passes": self.backward_passes,
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.backward_passes = int(state["backward_passes"])
        self.train_seconds = float(state["train_seconds"])
        self.train_cpu_seconds = float(state["train_cpu_seconds"])
