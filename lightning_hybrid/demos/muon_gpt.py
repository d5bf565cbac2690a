"""The char GPT trained as modern recipes train: Muon for the hidden 2-D weight matrices, AdamW for the embeddings,
norms, biases and head, both on one loss. In Lightning that is manual optimization with two optimizers: one
``manual_backward``, then each optimizer's ``step`` (Lightning counts each as a global step, so ``max_steps`` is
twice the batches), each with its own schedule."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from lightning_hybrid.demos.char_gpt import CharGPT
from lightning_hybrid.demos.gpt import lr_factor


class MuonGPT(CharGPT):
    """:class:`CharGPT` with Muon beside AdamW. ``lr`` is both optimizers' peak rate: Muon's updates are scaled to
    AdamW's RMS (``adjust_lr_fn="match_rms_adamw"``, Moonlight's rule), so one rate serves both; ``max_steps`` is
    the schedule's length in batches (the Trainer's ``max_steps`` counts two steps a batch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss, prog_bar=True)
        self.manual_backward(loss)
        for optimizer in self.optimizers():
            optimizer.step()
            optimizer.zero_grad()
        for scheduler in self.lr_schedulers():
            scheduler.step()
        return loss

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        hidden = [p for block in self.blocks for p in block.parameters() if p.ndim == 2]
        chosen = {id(p) for p in hidden}
        rest = [p for p in self.parameters() if id(p) not in chosen]
        muon = torch.optim.Muon(hidden, lr=hp.lr, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
        adamw = torch.optim.AdamW(rest, lr=hp.lr, weight_decay=0.01, fused=self._fused())
        schedule = partial(lr_factor, hp.schedule, hp.warmup_steps, hp.max_steps, hp.decay_fraction)
        return [muon, adamw], [torch.optim.lr_scheduler.LambdaLR(opt, schedule) for opt in (muon, adamw)]
