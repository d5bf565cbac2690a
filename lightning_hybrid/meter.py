"""RunMeter: what a fair comparison with plain Lightning needs, measured the same way for both runs."""

from __future__ import annotations

import time
from typing import Any

import torch
from typing_extensions import override

from lightning_hybrid.lightning_packages import CALLBACK_BASES


class RunMeter(*CALLBACK_BASES):
    """Counts backward passes (``on_before_backward``, which plain and hybrid training both call once per backward)
    and measures training time with validation excluded, as wall time and as this process's CPU time (all
    threads), which other load on a shared machine distorts far less. Keeps each validation inside ``fit`` as
    ``(step, training wall seconds, training CPU seconds, monitor)``, so a comparison can say when a run first
    reached a loss, and what the validations cost (``val_seconds``, wall).

    Args:
        monitor: the logged validation metric to keep.
    """

    def __init__(self, monitor: str = "val_loss") -> None:
        self.monitor = monitor
        self.validations: list[tuple[int, float, float, float]] = []
        self.backward_passes = 0
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0
        self.val_seconds = 0.0
        self._wall0 = self._cpu0 = self._val0 = 0.0
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
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start()

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()

    @override
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._running:  # validation inside fit: pause the training clock
            self._stop()
            self._paused, self._val0 = True, time.perf_counter()

    @override
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._paused:
            self.val_seconds += time.perf_counter() - self._val0
            value = trainer.callback_metrics.get(self.monitor)
            if value is not None and not trainer.sanity_checking:
                step, wall, cpu = trainer.global_step, self.train_seconds, self.train_cpu_seconds
                self.validations.append((step, wall, cpu, float(value)))
            self._paused = False
            self._start()

    def first_reached(self, target: float) -> tuple[int, float, float] | None:
        """The step and training seconds (wall, CPU) of the first validation inside ``fit`` at or below ``target``."""
        return next(((step, wall, cpu) for step, wall, cpu, value in self.validations if value <= target), None)

    @override
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self.backward_passes += 1

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "backward_passes": self.backward_passes,
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
            "val_seconds": self.val_seconds,
            "validations": [list(v) for v in self.validations],
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.backward_passes = int(state["backward_passes"])
        self.train_seconds = float(state["train_seconds"])
        self.train_cpu_seconds = float(state["train_cpu_seconds"])
        self.val_seconds = float(state.get("val_seconds", 0.0))  # not kept before 0.1.0's release
        old = float("nan")  # a checkpoint of version 0.1.0 kept no CPU seconds by validation
        saved = [v if len(v) == 4 else (v[0], v[1], old, v[2]) for v in state.get("validations", [])]
        self.validations = [(int(a), float(b), float(c), float(d)) for a, b, c, d in saved]
