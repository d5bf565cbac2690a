"""A hybrid run that checkpoints at every epoch end (2 steps) and, with ``--kill``, SIGKILLs itself in the middle
of a Predict segment: ``python -m tests.faults.kill_worker ROOT [--kill]``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import Phase
from tests.helpers import RegressionModel, hybrid_trainer, loader, scheduler_of

STEPS = 40
KILL_AFTER = 20  # the first Predict step past this one, with a predicted step already applied


class KillMidPredict(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, idx) -> None:
        scheduler = scheduler_of(trainer)
        inside_segment = scheduler.phase is Phase.PREDICT and scheduler.engine.machine.segment_pos > 0
        if trainer.global_step > KILL_AFTER and inside_segment:
            os.kill(os.getpid(), signal.SIGKILL)


def run(root: Path, kill: bool = False, ckpt_path: Path | None = None) -> RegressionModel:
    checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    extra = [checkpoints, KillMidPredict()] if kill else [checkpoints]
    trainer, _ = hybrid_trainer(STEPS, extra_callbacks=extra, logger=False, enable_checkpointing=True)
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)  # 2 steps per epoch
    return model


if __name__ == "__main__":
    run(Path(sys.argv[1]), kill="--kill" in sys.argv)
