"""A small byte-level GPT (nanoGPT-style) and its data: the Python standard library's own ``.py`` files.

Needs no download: the corpus is every ``.py`` file under this interpreter's standard library (site-packages and,
unless asked for, the tests excluded), in sorted path order, so every machine with the same Python builds the same
corpus.
"""

from __future__ import annotations

import functools
import math
import os
import sysconfig
from functools import partial
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.text import Perplexity

from lightning_hybrid.demos.splits import SplitData, TokenWindows
from lightning_hybrid.settings import check_choice, check_float, check_optional_bool

# ----------------------------------------------------------------------------------------------------- data


@functools.cache
def stdlib_files(include_tests: bool = False) -> tuple[Path, ...]:
    """The standard library's ``.py`` files in sorted path order, ``site-packages`` (and, unless asked for, ``test/``
    folders) left unvisited: walking the installed packages too took seconds at every ``setup``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages"} if include_tests else {"site-packages", "test"}
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in skipped]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    return tuple(sorted(files))


def stdlib_corpus(max_bytes: int, include_tests: bool = False) -> bytes:
    """The first ``max_bytes`` of the standard library's ``.py`` files, concatenated in sorted path order; its own
    tests (``test/`` folders) only with ``include_tests``: about 13 MB without them, 31 MB with (Python 3.11)."""
    chunks, total = [], 0
    for path in stdlib_files(include_tests):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def byte_ids(data: bytes) -> torch.Tensor:
    """The bytes as token ids (the vocabulary is the 256 byte values)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


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


# ---------------------------------------------------------------------------------------------------- model


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


SCHEDULES = ("cosine", "wsd", "constant")


def lr_factor(schedule: str, warmup: int, total: int, decay_fraction: float, step: int) -> float:
    """The learning rate at ``step`` as a fraction of the peak: a linear warmup, then ``cosine`` to 10%,
    ``wsd`` (warmup-stable-decay: constant, then linear to 10% over the last ``decay_fraction`` of the run, the
    schedule of current LLM pretraining) or ``constant``."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        decay_start = total - decay_fraction * total
        return 1.0 - 0.9 * min(1.0, max(0.0, step - decay_start) / max(1.0, total - decay_start))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


class CharGPT(L.LightningModule):
    """A small GPT over bytes; an ordinary LightningModule that knows nothing of hybrid training."""

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
        super().__init__()
        check_choice("CharGPT", "schedule", schedule, SCHEDULES)
        check_float("CharGPT", "decay_fraction", decay_fraction, 0.0, 1.0, open_low=True)
        check_optional_bool("CharGPT", "fused", fused, "fused on GPUs")
        self.save_hyperparameters()
        self.tok = nn.Embedding(256, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, 256, bias=False)
        self.val_perplexity = Perplexity()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
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
