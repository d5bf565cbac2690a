"""The char GPT (:mod:`~lightning_hybrid.demos.gpt`) in Lightning: its LightningModule and its DataModule of
train/validation windows from the standard library's own ``.py`` files (no download)."""

from __future__ import annotations

from functools import partial

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.text import Perplexity

from lightning_hybrid.demos.gpt import GPT, SCHEDULES, byte_ids, lr_factor, stdlib_corpus
from lightning_hybrid.demos.splits import SplitData, TokenWindows
from lightning_hybrid.settings import check_choice, check_float, check_optional_bool


class StdlibText(SplitData):
    """Train/validation windows from the standard-library corpus; the last ``val_fraction`` is validation.

    Args:
        block_size: bytes per window.
        batch_size: windows per batch.
        max_bytes: corpus size, taken from the start of the sorted file list.
        include_tests: read the standard library's own tests too, for runs too long for its 13 MB without them
            (a benchmark must not repeat its data unawares).
        val_fraction: share of the corpus, at its end, held out for validation.
        seed: seed of the training shuffle.
        num_workers: dataloader worker processes.
    """

    def __init__(
        self,
        block_size: int = 64,
        batch_size: int = 32,
        max_bytes: int = 1_000_000,
        include_tests: bool = False,
        val_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(val_fraction)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        corpus = stdlib_corpus(hp.max_bytes, hp.include_tests)
        split = int(len(corpus) * (1 - hp.val_fraction))
        self.train_set = TokenWindows(byte_ids(corpus[:split]), hp.block_size)
        self.val_set = TokenWindows(byte_ids(corpus[split:]), hp.block_size)


class CharGPT(GPT, L.LightningModule):
    """The small GPT over bytes (:class:`~lightning_hybrid.demos.gpt.GPT`) as an ordinary LightningModule that knows
    nothing of hybrid training."""

    def __init__(
        self,
        n_layer: int = 2,
        n_head: int = 4,
        n_embd: int = 128,
        block_size: int = 64,
        lr: float = 3e-3,
        warmup_steps: int = 50,
        max_steps: int = 600,
        schedule: str = "cosine",
        decay_fraction: float = 0.2,
        fused: bool | None = None,
    ) -> None:
        super().__init__(n_layer, n_head, n_embd, block_size)
        check_choice("CharGPT", "schedule", schedule, SCHEDULES)
        check_float("CharGPT", "decay_fraction", decay_fraction, 0.0, 1.0, open_low=True)
        check_optional_bool("CharGPT", "fused", fused, "fused on GPUs")
        self.save_hyperparameters()
        self.val_perplexity = Perplexity()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(*batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits.flatten(0, 1), y.flatten()), prog_bar=True)
        self.val_perplexity(logits, y)
        self.log("val_ppl", self.val_perplexity)  # accumulated over the epoch, synced across ranks

    def _fused(self) -> bool:
        """AdamW fused where ``fused`` says; by default on GPUs, as nanoGPT does: faster, and it takes the
        device-side skip of idle hybrid steps (``fused=False`` is torch's default AdamW, every step read)."""
        fused = self.hparams.get("fused")
        return self.device.type == "cuda" if fused is None else fused

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=0.01, fused=self._fused())

        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, partial(lr_factor, hp.schedule, hp.warmup_steps, hp.max_steps, hp.decay_fraction)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
