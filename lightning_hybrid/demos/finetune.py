"""Fine-tuning the byte-level GPT: pretrained on the standard library's source, then tuned on Python's documentation
topics (prose, where the pretraining saw code), with LoRA adapters through ``peft`` (``pip install
lightning-hybrid[finetune]``) or with every weight trainable.

Nothing is downloaded: the pretrained weights are trained here, once per size, deterministically (a seeded plain
torch loop), and cached outside the checkout (``$LIGHTNING_HYBRID_CACHE``, by default
``~/.cache/lightning_hybrid``); a missing cache file is rebuilt.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from lightning_hybrid.demos.char_gpt import CharGPT
from lightning_hybrid.demos.gpt import byte_ids, stdlib_corpus
from lightning_hybrid.demos.splits import SplitData, TokenWindows
from lightning_hybrid.settings import check_choice, check_int

MODES = ("lora", "full")
LORA_TARGETS = ["qkv", "proj", "mlp.0", "mlp.2"]  # every linear layer of every block


def cache_dir() -> Path:
    return Path(os.environ.get("LIGHTNING_HYBRID_CACHE", Path.home() / ".cache" / "lightning_hybrid"))


def pretrained_weights(n_layer: int, n_head: int, n_embd: int, block_size: int, steps: int) -> dict:
    """The char GPT of this size after ``steps`` of AdamW (3e-3, cosine to 10%) on random windows of the standard
    library's source, seed 1234; trained on first use and cached (about 2 minutes at 0.47M parameters, 8 at 3.3M).

    Built on one thread whatever the caller's setting: a matrix product sums in another order on two threads, so
    the weights (and every fine-tuning run from them) would depend on which process built the cache first. Other
    CPUs can still round differently: :func:`fingerprint` tells the weights apart."""
    path = cache_dir() / f"char_gpt_{n_layer}x{n_embd}_h{n_head}_b{block_size}_{steps}steps_1thread.pt"
    if path.exists():
        return torch.load(path, map_location="cpu", weights_only=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        weights = _pretrain(n_layer, n_head, n_embd, block_size, steps)
    finally:
        torch.set_num_threads(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(weights, partial)
    partial.replace(path)  # whole or absent, also with two processes building it at once
    return weights


def fingerprint(weights: dict) -> str:
    """A short hash of the weights' values: fine-tuning runs compare only where they started from the same ones."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(weights[name].contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _pretrain(n_layer: int, n_head: int, n_embd: int, block_size: int, steps: int) -> dict:
    generator = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    model = CharGPT(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size)
    ids = byte_ids(stdlib_corpus(1_000_000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        starts = torch.randint(0, len(ids) - block_size - 1, (32,), generator=generator)
        x = torch.stack([ids[s : s + block_size] for s in starts])
        y = torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class PydocText(SplitData):
    """Byte windows over the interpreter's documentation topics (``pydoc_data.topics``, in sorted topic order);
    the last ``val_fraction`` is validation.

    Args:
        block_size: bytes per window.
        batch_size: windows per batch.
        val_fraction: share of the text, at its end, held out for validation.
        seed: seed of the training shuffle.
        num_workers: dataloader worker processes.
    """

    def __init__(
        self, block_size: int = 64, batch_size: int = 32, val_fraction: float = 0.1, seed: int = 0, num_workers: int = 0
    ) -> None:
        super().__init__(val_fraction)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        from pydoc_data.topics import topics

        hp = self.hparams
        ids = byte_ids("\n".join(topics[name] for name in sorted(topics)).encode())
        split = int(len(ids) * (1 - hp.val_fraction))
        self.train_set = TokenWindows(ids[:split], hp.block_size)
        self.val_set = TokenWindows(ids[split:], hp.block_size)


class FineTuneGPT(CharGPT):
    """The char GPT, pretrained (:func:`pretrained_weights`), fine-tuned with LoRA adapters on every linear layer
    of every block (``mode="lora"``: only the adapters train; the base weights stay as pretrained) or in full.

    Args:
        mode: ``"lora"`` or ``"full"``.
        rank: LoRA rank; ``alpha``: LoRA scale numerator (the adapters' output is scaled by ``alpha / rank``).
        pretrain_steps: steps of the pretraining whose weights it starts from.
        **kwargs: :class:`CharGPT`'s arguments (its size must match the pretrained one's); fine-tuning defaults to
            a constant learning rate after a short warmup.
    """

    def __init__(
        self,
        mode: str = "lora",
        rank: int = 8,
        alpha: float = 16.0,
        pretrain_steps: int = 800,
        n_layer: int = 2,
        n_head: int = 4,
        n_embd: int = 128,
        block_size: int = 64,
        lr: float = 3e-3,
        warmup_steps: int = 20,
        max_steps: int = 400,
        schedule: str = "constant",
        decay_fraction: float = 0.2,
    ) -> None:
        check_choice("FineTuneGPT", "mode", mode, MODES)
        check_int("FineTuneGPT", "rank", rank, 1)
        check_int("FineTuneGPT", "pretrain_steps", pretrain_steps, 1)
        super().__init__(n_layer, n_head, n_embd, block_size, lr, warmup_steps, max_steps, schedule, decay_fraction)
        self.save_hyperparameters()
        self.load_state_dict(pretrained_weights(n_layer, n_head, n_embd, block_size, pretrain_steps))
        if mode == "lora":
            try:
                from peft import LoraConfig, inject_adapter_in_model
            except ImportError as err:  # an optional extra: say how to get it
                raise ImportError(
                    "FineTuneGPT(mode='lora') needs peft: pip install 'lightning-hybrid[finetune]'"
                ) from err
            inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=LORA_TARGETS), self)
            for name, param in self.named_parameters():
                param.requires_grad_("lora_" in name)
