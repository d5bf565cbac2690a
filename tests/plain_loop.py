"""A plain PyTorch loop on the char GPT demo with the plugin, as a loop of one's own takes it (``HybridLoop``): it
imports no Lightning. ``python -m tests.plain_loop STEPS`` trains, then prints the summary's jumps and the Lightning
modules the interpreter imported, as JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch import Tensor

from lightning_hybrid import HybridLoop
from lightning_hybrid.demos.gpt import GPT, byte_ids, stdlib_corpus

SIZE = dict(n_layer=1, n_head=2, n_embd=16, block_size=16)
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")


def batches(n: int, size: int = 4, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """``n`` batches of ``size`` windows of the corpus, inputs and next bytes, drawn once in a fixed order."""
    ids, block = byte_ids(stdlib_corpus(100_000)), SIZE["block_size"]
    starts = torch.randint(0, len(ids) - block - 1, (n, size), generator=torch.Generator().manual_seed(seed))
    return [(torch.stack([ids[s : s + block] for s in row]), torch.stack([ids[s + 1 : s + block + 1] for s in row]))
            for row in starts]  # fmt: skip


def train(steps: int, **settings: Any) -> tuple[GPT, HybridLoop]:
    """The loop: the user's model, optimizer and batches, and the plugin's two lines."""
    torch.manual_seed(0)
    model = GPT(**SIZE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    hybrid = HybridLoop(model, optimizer, max_steps=steps, **settings)  # the plugin
    for x, y in batches(steps):
        loss = model.loss(x, y)
        hybrid.record_loss(loss)  # the plugin
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, hybrid


if __name__ == "__main__":
    _, hybrid = train(int(sys.argv[1]), warmup_steps=5, full_steps=6, verify_window=3, verify_resolution=0.0)
    imported = sorted(m for m in sys.modules if m.split(".")[0] in LIGHTNING)
    print(json.dumps({"jumps_made": hybrid.summary()["jumps_made"], "lightning": imported}))
