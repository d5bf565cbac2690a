"""Quiet steps: guarded on the device and read later, many at once. The engine keeps them here in step order, and
reads them with one transfer to the host before it learns from each, in order, as if it had read it at once."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid.engine.guard import SKIPPED, loss_and_norm
from lightning_hybrid.engine.record import StepRecord
from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import RunCounters


@dataclass
class Deferred:
    """A quiet step whose reading waits on the device: the engine learns from it, in order, when it next reads."""

    step: StepRecord
    global_step: int
    seconds: float
    lrs: list[float]
    tracked: Tensor | list[list[float]] | None = None  # the predictor's device half of observing the update

    def to_dict(self) -> dict[str, Any]:
        step = self.step
        return {
            "phase": int(step.phase),
            "backed_off": step.backed_off,
            "global_step": self.global_step,
            "seconds": self.seconds,
            "lrs": list(self.lrs),
            "reading": _host_reading(step.reading),
            "tracked": _host(self.tracked),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Deferred:
        step = StepRecord(
            phase=Phase(state["phase"]),
            backed_off=state["backed_off"] or None,  # a reason; earlier checkpoints hold a bool, read for its truth
            quiet=True,
            reading=state["reading"],
            delta_ready=state["tracked"] is not None,  # its update was folded in when it ran
        )
        lrs = [float(v) for v in state["lrs"]]
        return cls(step, int(state["global_step"]), float(state["seconds"]), lrs, state["tracked"])


def _host(values: Tensor | list | None) -> list | None:
    return values.tolist() if isinstance(values, Tensor) else values


def host_reading(values: list[float], skipped: float) -> list[float]:
    """A quiet step's reading on the host, ``[loss, grad_norm, nonfinite, outlier]``, from what the device guard
    returned: a skipped step with finite values was skipped for its gradient norm."""
    loss, grad_norm = loss_and_norm(values)
    nonfinite = not (math.isfinite(loss) and math.isfinite(grad_norm))
    return [loss, grad_norm, float(nonfinite), float(bool(skipped) and not nonfinite)]


def _host_reading(reading: tuple[Tensor, Tensor] | list[float] | None) -> list[float] | None:
    if isinstance(reading, tuple):
        return host_reading(reading[0].tolist(), reading[1].item())
    return reading


def _read(values: Tensor | list | None, flat: Iterator[float]) -> list | None:
    """``values``, a tensor whose numbers come next in ``flat``, as (nested) lists; anything else unchanged."""
    if not isinstance(values, Tensor):
        return values
    taken = [next(flat) for _ in range(values.numel())]
    return torch.tensor(taken, dtype=torch.float64).view(values.shape).tolist() if values.dim() > 1 else taken


def read_all(pending: list[Deferred], counters: RunCounters) -> list[tuple[int, str]]:
    """Bring every pending step's device values to the host in one transfer, and set each step's loss, gradient
    norm and whether its update was skipped (counted as the guard counts an ordinary step's). Returns the steps the
    guard skipped, with why (``SKIPPED``'s words)."""
    on_device = [d for d in pending if isinstance(d.step.reading, tuple)]
    tracked = [d for d in pending if isinstance(d.tracked, Tensor)]
    if on_device or tracked:  # the readings' values, their skips, then what was tracked: no operation per step
        parts = [d.step.reading[0] for d in on_device]
        parts += [torch.stack([d.step.reading[1] for d in on_device])] if on_device else []
        parts += [d.tracked.reshape(-1) if d.tracked.dim() != 1 else d.tracked for d in tracked]
        flat = iter(torch.cat(parts).tolist())
        values = [list(islice(flat, d.step.reading[0].numel())) for d in on_device]
        for d, measured, skipped in zip(on_device, values, list(islice(flat, len(on_device)))):
            d.step.reading = host_reading(measured, skipped)
        for d in tracked:
            d.tracked = _read(d.tracked, flat)
    skips = []
    for entry in pending:
        step = entry.step
        if step.reading is None:
            step.skipped = True  # the user's training_step skipped the batch
            continue
        step.loss, step.grad_norm, nonfinite, outlier = step.reading
        step.skipped, step.reading = bool(nonfinite or outlier), None
        counters.nonfinite_steps_skipped += int(bool(nonfinite))
        counters.outlier_steps_skipped += int(bool(outlier and not nonfinite))
        if step.skipped:
            skips.append((entry.global_step, SKIPPED[bool(nonfinite)]))
    return skips
