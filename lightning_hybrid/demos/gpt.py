"""The char GPT in plain torch: its corpus (the Python standard library's own ``.py`` files: no download, the same
on every machine with the same Python), a small byte-level GPT (nanoGPT-style) and its learning-rate schedule.
:mod:`~lightning_hybrid.demos.char_gpt` trains it with Lightning; a loop of one's own takes it as it is."""

from __future__ import annotations

import functools
import math
import os
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

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


class GPT(nn.Module):
    """A small GPT over bytes (the vocabulary is the 256 byte values)."""

    def __init__(self, n_layer: int = 2, n_head: int = 4, n_embd: int = 128, block_size: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, 256, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The next-byte cross-entropy of ``x`` against ``y``."""
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())
