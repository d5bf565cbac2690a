"""Runs that SIGKILL themselves, each in a process forked from this one (``tests.forked_ranks.forked``), which imports
once: the per-step mode in the middle of a Predict segment (checkpoints every 2 steps, an epoch's end), and the
default on short cycles one step after the checkpoint at each point of its cycle (``POINTS``), with no clean-up at
all, and while writing its checkpoint between a jump and its verdict. Each run's checkpoints go to
``<root>/<name>/``, its output to ``<root>/<name>.log``, every run's exit code to ``<root>/exit_codes.json``.

    python -m tests.faults.kill_worker <root>
"""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO

from lightning_hybrid import Phase, hybrid_callbacks
from tests.faults.common import MODES
from tests.forked_ranks import forked
from tests.helpers import RegressionModel, flat_params, hybrid_trainer, loader, plugin_state, scheduler_of

STEPS = 40
KILL_AFTER = 20  # the first Predict step past this one, with a predicted step already applied
CYCLE_STEPS = 80  # 2 steps an epoch, a checkpoint at each epoch's end (plain Lightning resumes those bitwise)
DEFAULT_SHORT = {**MODES["default"], "warmup_steps": 6}  # cycle ends at even steps: each point has a checkpoint
POINTS = {  # a point of the default's cycle, known from a checkpoint's scheduler state (and the one before it)
    "in the plugin's warm-up": lambda s, _: s["machine"]["phase"] == 0 and s["machine"]["phase_step"] > 0,
    "just before a jump": lambda s, _: s["family"]["jump_due"],
    "between a jump and its verdict": lambda s, _: s["family"]["pending"],
    "right after an undo": lambda s, b: (
        s["record"]["counters"]["jumps_rejected"] > b["record"]["counters"]["jumps_rejected"]
    ),
}


def first_at_each_point(checkpoints: list[Path]) -> dict[str, Path]:
    """Of checkpoints in step order, the first at each point of the cycle (never the first checkpoint)."""
    states, found = [plugin_state(torch.load(p, weights_only=False)) for p in checkpoints], {}
    for i, (path, state) in enumerate(zip(checkpoints, states, strict=True)):
        for point, at in POINTS.items():
            if point not in found and i > 0 and at(state, states[i - 1]):
                found[point] = path
    return found


class KillMidPredict(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, idx) -> None:
        scheduler = scheduler_of(trainer)
        inside_segment = scheduler.phase is Phase.PREDICT and scheduler.engine.machine.segment_pos > 0
        if trainer.global_step > KILL_AFTER and inside_segment:
            os.kill(os.getpid(), signal.SIGKILL)


class AtPoint(TorchCheckpointIO):
    """Saves as Lightning does, and says whether the checkpoint it saved last is the run's first at ``point`` (its
    plugin state against the one saved before it). With ``die_writing``, that checkpoint is written half, in place,
    and the process SIGKILLed: a kill during a write that is not atomic. Lightning's own writes a temporary file and
    moves it, atomic on one filesystem; a move across filesystems copies, and a user's ``CheckpointIO`` may write in
    place: either can leave the file cut short."""

    def __init__(self, point: str, die_writing: bool = False) -> None:
        super().__init__()
        self.point, self.die_writing, self.before, self.reached = point, die_writing, None, False

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        state = plugin_state(checkpoint)
        self.reached = self.before is not None and POINTS[self.point](state, self.before)
        if self.reached and self.die_writing:
            written = io.BytesIO()
            torch.save(checkpoint, written)
            with open(path, "wb") as file:
                file.write(written.getvalue()[: written.tell() // 2])
                file.flush()
                os.fsync(file.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        self.before = copy.deepcopy(state)
        super().save_checkpoint(checkpoint, path, storage_options)


class KillAfter(L.Callback):
    """The step after ``watch`` saved the checkpoint at its point runs, then SIGKILL (Lightning calls checkpointing
    callbacks last: that step's end saves nothing)."""

    def __init__(self, watch: AtPoint) -> None:
        self.watch, self.due = watch, False

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        self.due, self.watch.reached = self.watch.reached, False

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if self.due:
            os.kill(os.getpid(), signal.SIGKILL)


def run(root: Path, kill: bool = False, ckpt_path: Path | None = None) -> RegressionModel:
    """The per-step mode's run, checkpointing every 2 steps; with ``kill``, dying inside a Predict segment."""
    checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    extra = [checkpoints, KillMidPredict()] if kill else [checkpoints]
    trainer, _ = hybrid_trainer(STEPS, extra_callbacks=extra, logger=False, enable_checkpointing=True)
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)  # 2 steps per epoch
    return model


def cycle_run(
    root: Path, ckpt_path: Path | None = None, kill_at: str | None = None, writing: bool = False
) -> tuple[torch.Tensor, dict]:
    """The default on short cycles, checkpointing every 2 steps into ``root`` (unless resuming ``ckpt_path``);
    with ``kill_at``, dying the step after the first checkpoint at that point, or with ``writing`` while writing
    it. Its weights and summary."""
    saving = ckpt_path is None
    extra = [ModelCheckpoint(root, every_n_train_steps=2, save_top_k=-1, filename="{step}")] if saving else []
    watch = [AtPoint(kill_at, die_writing=writing)] if kill_at else []
    extra += [KillAfter(watch[0])] if kill_at and not writing else []
    trainer, _ = hybrid_trainer(CYCLE_STEPS, hybrid=hybrid_callbacks(**DEFAULT_SHORT), extra_callbacks=extra,
                                logger=False, enable_checkpointing=saving, default_root_dir=root,
                                plugins=watch)  # fmt: skip
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)
    return flat_params(model), scheduler_of(trainer).summary()


WRITING = "between a jump and its verdict"  # the point at which a run dies writing its checkpoint
KILLS = {
    "per-step": partial(run, kill=True),
    **{point: partial(cycle_run, kill_at=point) for point in POINTS},
    "writing": partial(cycle_run, kill_at=WRITING, writing=True),
}


def main(root: Path) -> None:
    names = list(KILLS)
    codes = forked([partial(KILLS[n], root / n) for n in names], [root / f"{n}.log" for n in names])
    (root / "exit_codes.json").write_text(json.dumps(dict(zip(names, codes))))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
