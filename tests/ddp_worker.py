"""One rank of a 2-process CPU DDP run, launched by ``tests/test_ddp.py`` like torchrun would: two ranks on one
node, or (third argument ``2``) one rank on each of two simulated nodes.

Writes the phase of every step, the first batch it saw and its final parameters to ``<out>/rank<R>.pt``.
"""

from __future__ import annotations

import sys

import lightning as L
import torch

from lightning_hybrid import HybridDDPStrategy, HybridScheduler, hybrid_callbacks
from tests.helpers import FAST, FAST_PHASES, RegressionModel, flat_params, hybrid_trainer, loader
from tests.test_resume import LEARNED, _callbacks


class Record(L.Callback):
    def __init__(self) -> None:
        self.phases: list[int] = []
        self.first_batch: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        if self.first_batch is None:
            self.first_batch = batch[0].clone()
        scheduler = next(cb for cb in trainer.callbacks if isinstance(cb, HybridScheduler))
        self.phases.append(int(scheduler.phase))


def main(out_dir: str, kind: str, nodes: int = 1) -> None:
    record = Record()
    if kind == "linear":
        callbacks = hybrid_callbacks(**FAST)
    elif kind == "exploding":
        callbacks = _callbacks("exploding")
    else:  # a learned predictor with the bandit timing steps in wall-clock seconds, which differ per rank
        callbacks = hybrid_callbacks(predictor=kind, **FAST_PHASES, **LEARNED[kind])
    trainer, _ = hybrid_trainer(
        60,
        hybrid=callbacks,
        extra_callbacks=[record],
        devices=2 // nodes,
        num_nodes=nodes,
        strategy=HybridDDPStrategy(process_group_backend="gloo"),
        logger=False,
        default_root_dir=out_dir,
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(512, batch_size=16))
    scheduler = next(cb for cb in trainer.callbacks if isinstance(cb, HybridScheduler))
    torch.save(
        {
            "phases": record.phases,
            "first_batch": record.first_batch,
            "params": flat_params(model),
            "summary": scheduler.summary(),
            "monitor": scheduler.monitor.state_dict(),
            "loss_trend": scheduler.predictor.predictor.state_dict()["trend"],
        },
        f"{out_dir}/rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
