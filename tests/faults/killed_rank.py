"""Two CPU ranks under ``hybrid_ddp`` training the default on short cycles, started together as torchrun starts
them (``tests.forked_ranks``), a checkpoint at every epoch's end (8 steps). First rank 1 SIGKILLs itself between a
jump and its verdict, writing the step to ``<out>/killed_at``; rank 0, left in a collective, must end by Lightning's
own timeout (``TIMEOUT_S``, the strategy's). Then two new ranks fit uninterrupted and resume from the killed run's
last checkpoint; each rank writes its weights and summary after each fit (``tests.launched_ranks.KeepWeights``).
Each launch's exit codes go to ``<out>/exit_codes.json``, its ranks' output to ``<out>/<launch>/rank<R>.log``.

    python -m tests.faults.killed_rank <out>
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import HybridDDPStrategy, hybrid_callbacks
from lightning_hybrid.callbacks import find_scheduler
from tests import forked_ranks
from tests.helpers import DEFAULT_JUMPING, RULE_PHASES, RegressionModel, by_step, loader
from tests.launched_ranks import KeepWeights, two_ranks

STEPS, EVERY, KILL_AFTER = 24, 8, 18
TIMEOUT_S = 30


class KillMidCycle(L.Callback):
    """Rank 1 dies past ``KILL_AFTER`` at the first step whose jump awaits its verdict."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        pending = find_scheduler(trainer).engine.family.state.pending
        if trainer.global_rank == 1 and trainer.global_step > KILL_AFTER and pending:
            (self.out / "killed_at").write_text(str(trainer.global_step))
            os.kill(os.getpid(), signal.SIGKILL)


def fit(out: Path, name: str, kill: bool = False, ckpt_path: Path | None = None) -> None:
    saving = ckpt_path is None
    callbacks = [*hybrid_callbacks(**RULE_PHASES, **DEFAULT_JUMPING), KeepWeights(str(out / name))]
    if saving:
        ckpt = out / name / "ckpt"
        callbacks.append(ModelCheckpoint(ckpt, every_n_train_steps=EVERY, save_top_k=-1, filename="{step}"))
    if kill:
        callbacks.append(KillMidCycle(out))
    strategy = HybridDDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
    trainer = two_ranks(L.pytorch, strategy, STEPS, callbacks, saving, out)
    trainer.fit(RegressionModel(scheduler=True), loader(256, batch_size=16), ckpt_path=ckpt_path)


def uninterrupted_then_resumed(out: Path) -> None:
    fit(out, "full")
    fit(out, "resumed", ckpt_path=by_step(out / "killed" / "ckpt")[-1])


def main(out: Path) -> None:
    codes = {
        "killed": forked_ranks.run(partial(fit, out, "killed", kill=True), out / "killed", timeout_s=TIMEOUT_S + 300)
    }
    codes["resumed"] = forked_ranks.run(partial(uninterrupted_then_resumed, out), out / "resumed")
    (out / "exit_codes.json").write_text(json.dumps(codes))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
