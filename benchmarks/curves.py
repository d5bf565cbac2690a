"""Validation curves of a run against training time and backward passes, and the time-to-target arithmetic.

A curve is a list of :class:`Point` s recorded at each validation inside ``fit``; the clocks are the
:class:`~lightning_hybrid.meter.RunMeter`'s, so validation time is excluded from both runs alike. Time to a target
means something only on a curve that falls to its end: a plain curve whose last validation is more than
``RISE_TOLERANCE`` above its lowest (:func:`overfits`) has turned up, so a run reaching its final loss would measure
how fast it got back down to a worse point; the harness gives no time to target for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.meter import RunMeter

AXES = ("wall_s", "cpu_s", "backward")  # what a curve can be read against
# Above this rise of the last validation over the lowest, a curve has turned up. The plain curves of the char GPT
# family (58 runs, 1,000 steps, every rate) end at most 0.3% above their lowest; digits' end 6-98% above theirs.
RISE_TOLERANCE = 0.01


@dataclass
class Point:
    """Where a run stood at one moment: its step, its training-time clocks and backward passes so far."""

    step: int
    wall_s: float
    cpu_s: float
    backward: int
    val_loss: float = float("nan")
    train_loss: float = float("nan")  # the mean training loss of the steps since the last validation


@dataclass
class Curve:
    """A run's validations, and the moments its Predict segments started and ended."""

    points: list[Point] = field(default_factory=list)
    segments: list[tuple[Point, Point]] = field(default_factory=list)

    def axis(self, name: str) -> list[float]:
        return [getattr(p, name) for p in self.points]

    @property
    def losses(self) -> list[float]:
        return [p.val_loss for p in self.points]

    def at_step(self, step: int) -> float | None:
        """The validation loss measured at ``step``, if there was one."""
        return next((p.val_loss for p in self.points if p.step == step), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [asdict(p) for p in self.points],
            "segments": [[asdict(a), asdict(b)] for a, b in self.segments],
        }


def rise_at_end(losses: Sequence[float]) -> float:
    """How far the last validation loss lies above the lowest, as a fraction of the lowest (0 on a curve that ends
    at its lowest; NaN where a loss is not finite)."""
    if not losses or any(not math.isfinite(v) for v in losses):
        return math.nan
    lowest = min(losses)
    return losses[-1] / lowest - 1 if lowest > 0 else losses[-1] - lowest


def overfits(losses: Sequence[float]) -> bool:
    """Whether a curve has turned up at its end: its last validation more than ``RISE_TOLERANCE`` above its lowest."""
    return rise_at_end(losses) > RISE_TOLERANCE


def lowest_in_last_tenth(losses: Sequence[float]) -> bool:
    """Whether a curve is lowest in its last tenth (a non-finite loss counts as the highest): a rate whose curve is
    lowest earlier gives no time to its final loss, so a sweep prefers the others."""
    lowest = min(range(len(losses)), key=lambda i: losses[i] if losses[i] == losses[i] else float("inf"))
    return lowest >= 0.9 * (len(losses) - 1)


def time_to_target(xs: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """The first ``x`` at which the loss is at or below ``target``, interpolating linearly between evaluations;
    ``None`` if it never gets there. A first evaluation already at the target counts at its own ``x``."""
    for i, (x, loss) in enumerate(zip(xs, losses)):
        if loss <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], losses[i - 1]
            return x0 + (y0 - target) / (y0 - loss) * (x - x0)
    return None


def value_at(xs: Sequence[float], losses: Sequence[float], x: float) -> float | None:
    """The loss at ``x`` by linear interpolation between evaluations; ``None`` outside the evaluated range."""
    for i in range(1, len(xs)):
        if xs[i - 1] <= x <= xs[i]:
            span = xs[i] - xs[i - 1]
            w = (x - xs[i - 1]) / span if span > 0 else 1.0
            return losses[i - 1] + w * (losses[i] - losses[i - 1])
    return losses[0] if xs and xs[0] == x else None


class CurveRecorder(Callback):
    """Records a :class:`Curve` during ``fit``: a point at every validation, with the mean training loss since the
    last, and at every Predict segment's start and end. ``stop`` (given the curve so far) may end training early,
    once a run has shown what it must.

    The points read the clocks of the Trainer's :class:`RunMeter`, which must be among its callbacks.

    Args:
        monitor: the logged validation metric.
        stop: called after each validation; training stops when it returns ``True``.
    """

    def __init__(self, monitor: str = "val_loss", stop: Callable[[Curve], bool] | None = None) -> None:
        self.monitor, self.stop = monitor, stop
        self.curve = Curve()
        self._segment_start: Point | None = None
        self._scheduler: Any = None
        self.meter: RunMeter | None = None
        self._train_sum: Any = 0.0  # the training losses since the last validation, summed on their device
        self._train_steps = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meters = [cb for cb in trainer.callbacks if isinstance(cb, RunMeter)]
        if not meters:
            raise RuntimeError("CurveRecorder reads the clocks of a RunMeter; add one to the Trainer's callbacks")
        self.meter = meters[0]
        self._scheduler = find_scheduler(trainer)

    def _point(self, trainer: pl.Trainer) -> Point:
        """Where the run stands; its step counts batches (Lightning counts a step per optimizer)."""
        wall, cpu = self.meter.elapsed()
        return Point(trainer.global_step // max(1, len(trainer.optimizers)), wall, cpu, self.meter.backward_passes)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, Tensor):  # summed where it lies: read once, at the next validation
            self._train_sum = self._train_sum + loss.detach().float()
            self._train_steps += 1
        if self._scheduler is None:
            return
        if self._scheduler.predicting and self._segment_start is None:
            self._segment_start = self._point(trainer)
        elif not self._scheduler.predicting and self._segment_start is not None:
            self.curve.segments.append((self._segment_start, self._point(trainer)))
            self._segment_start = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A segment still open when training stops (``stop``, ``max_steps``) ends with the run: every segment
        started is recorded, wherever the run happened to stop."""
        if self._segment_start is not None:
            self.curve.segments.append((self._segment_start, self._point(trainer)))
            self._segment_start = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        point = self._point(trainer)
        point.val_loss = float(trainer.callback_metrics[self.monitor])
        if self._train_steps:
            point.train_loss = float(self._train_sum) / self._train_steps
            self._train_sum, self._train_steps = 0.0, 0
        self.curve.points.append(point)
        if self.stop is not None and self.stop(self.curve):
            trainer.should_stop = True
