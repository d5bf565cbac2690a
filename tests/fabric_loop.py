"""A Fabric loop shaped like LitGPT's pretraining ``fit``, with the plugin: the optimizer built from a class path and
stepped with ``optimizer.step()``, the learning rate set at each iteration, ``fabric.no_backward_sync`` while
accumulating, ``fabric.clip_gradients``, periodic validation, and ``fabric.save``/``fabric.load`` of a dict holding
the model, the optimizer and the iteration counters (the plugin's state rides in the optimizer's). The plugin's lines
are marked. On several ranks:

    python -m tests.fabric_loop ddp|fsdp <out> full|resume

trains to ``STEPS``, saving at ``SAVE`` (``full``), or resumes from that checkpoint (``resume``); each rank writes
the whole weights and the plugin's summary to ``<out>/<mode>-rank<R>.pt``.
"""

from __future__ import annotations

import importlib
import math
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

from lightning_hybrid import HybridLoop
from lightning_hybrid.demos.gpt import GPT
from tests.helpers import flat_params
from tests.plain_loop import SIZE, batches

STEPS, ACCUMULATE, CLIP, EVAL, SAVE = 30, 2, 1.0, 10, 12
LR = 3e-3
JUMPING = dict(warmup_steps=5, full_steps=6, verify_window=3, verify_resolution=0.0, outer_lr=1.6)
OPTIMIZER = {"class_path": "torch.optim.AdamW", "init_args": {"lr": LR, "weight_decay": 0.01}}


class LossGPT(GPT):
    """The demo GPT whose forward returns the loss, as LitGPT's loss is taken where the forward runs (inside its
    precision's autocast)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return F.cross_entropy(GPT.forward(self, x).flatten(0, 1), y.flatten())


def new_model(compiled: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = LossGPT(**SIZE)
    return torch.compile(model) if compiled else model


def get_lr(step: int) -> float:
    """LitGPT's shape of schedule, by optimizer step: a linear warm-up, then a cosine to a tenth."""
    warmup = min(1.0, (step + 1) / 5)
    return LR * warmup * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / STEPS))))


def instantiate_optimizer(spec: dict[str, Any], params: Any) -> torch.optim.Optimizer:
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(params, **spec["init_args"])


def validate(fabric: L.Fabric, model: torch.nn.Module, loader: Any) -> float:
    model.eval()
    with torch.no_grad():
        losses = [model(x, y) for x, y in loader]
    model.train()
    return fabric.all_reduce(torch.stack(losses).mean()).item()


def pretrain(
    fabric: L.Fabric,
    settings: dict[str, Any],
    compiled: bool = False,
    resume: Path | None = None,
    save: Path | None = None,
    plugin: bool = True,
) -> tuple[torch.nn.Module, HybridLoop | None]:
    """LitGPT's ``fit``, shortened; ``plugin=False``: the same loop without the plugin's lines."""
    model = fabric.setup(new_model(compiled))
    optimizer = fabric.setup_optimizers(instantiate_optimizer(OPTIMIZER, model.parameters()))
    hybrid = HybridLoop(model, optimizer, max_steps=STEPS, **settings) if plugin else None  # the plugin
    state = {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0}
    if resume is not None:
        fabric.load(resume, state)
    train_loader, val_loader = fabric.setup_dataloaders(
        DataLoader(batches(STEPS * ACCUMULATE * fabric.world_size), batch_size=None),
        DataLoader(batches(2 * fabric.world_size, seed=1), batch_size=None),
    )
    for i, (x, y) in enumerate(train_loader):
        if i < state["iter_num"]:  # what the resumed run has trained on
            continue
        for group in optimizer.param_groups:
            group["lr"] = get_lr(state["step_count"])
        state["iter_num"] += 1
        accumulating = state["iter_num"] % ACCUMULATE != 0
        with fabric.no_backward_sync(model, enabled=accumulating):
            loss = model(x, y)
            if hybrid is not None:
                hybrid.record_loss(loss / ACCUMULATE)  # the plugin
            fabric.backward(loss / ACCUMULATE)
        if accumulating:
            continue
        fabric.clip_gradients(model, optimizer, max_norm=CLIP)
        optimizer.step()
        optimizer.zero_grad()
        state["step_count"] += 1
        if state["step_count"] % EVAL == 0:
            with hybrid.eval() if hybrid is not None else nullcontext():  # the plugin (gpa's average)
                validate(fabric, model, val_loader)
        if save is not None and state["step_count"] == SAVE:
            fabric.save(save, state)
    return model, hybrid


def parallelize(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """FSDP2 over the data-parallel ranks: each block, then the rest."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh["data_parallel"])
    return fully_shard(model, mesh=mesh["data_parallel"])


def ranks(strategy: str, out: Path, mode: str) -> None:
    if strategy == "fsdp":
        strategy = ModelParallelStrategy(parallelize, data_parallel_size=2, tensor_parallel_size=1)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    resume = mode == "resume"
    model, hybrid = pretrain(
        fabric, JUMPING, save=None if resume else out / "ckpt", resume=out / "ckpt" if resume else None
    )
    saved = {"params": flat_params(model), "summary": hybrid.summary()}
    torch.save(saved, out / f"{mode}-rank{fabric.global_rank}.pt")


if __name__ == "__main__":
    ranks(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
