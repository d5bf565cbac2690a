"""Lightning's own demo LSTM network (``lightning.pytorch.demos.lstm.SimpleLSTM``) as a word-level language
model, on the Python documentation that ships with every Python (``pydoc_data.topics``).

The network is used unchanged, which shows that third-party model code needs nothing from the plugin. (Lightning's
``LightningLSTM`` wrapper downloads WikiText-2, so the module around it is written here.)
"""

from __future__ import annotations

import re
from collections import Counter

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos.lstm import SimpleLSTM
from torchmetrics.text import Perplexity

from lightning_hybrid.demos.splits import SplitData, TokenWindows

UNKNOWN = "<unk>"


def pydoc_words() -> list[str]:
    """Lower-cased words and punctuation of the interpreter's documentation topics, in sorted topic order."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[name] for name in sorted(topics))
    return re.findall(r"[a-z0-9_]+|[^\sa-z0-9_]", text.lower())


class PydocWords(SplitData):
    """Word windows over the documentation corpus; the vocabulary (the most frequent words of the training part,
    plus ``<unk>``) is built in ``setup``, and the last ``val_fraction`` is validation.

    Args:
        vocab_size: vocabulary size including ``<unk>``.
        seq_len: tokens per window.
        batch_size: windows per batch.
        val_fraction: share of the corpus, at its end, held out for validation.
        seed: seed of the training shuffle.
        num_workers: dataloader worker processes.
    """

    def __init__(
        self,
        vocab_size: int = 4000,
        seq_len: int = 35,
        batch_size: int = 20,
        val_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(val_fraction)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        words = pydoc_words()
        split = int(len(words) * (1 - hp.val_fraction))
        ranked = sorted(Counter(words[:split]).items(), key=lambda item: (-item[1], item[0]))
        vocab = {UNKNOWN: 0} | {word: i + 1 for i, (word, _) in enumerate(ranked[: hp.vocab_size - 1])}
        ids = torch.tensor([vocab.get(word, 0) for word in words])
        self.train_set = TokenWindows(ids[:split], hp.seq_len)
        self.val_set = TokenWindows(ids[split:], hp.seq_len)


class WordLSTM(L.LightningModule):
    """``SimpleLSTM`` with a fresh hidden state per window, trained with SGD as in the PyTorch word-language-model
    example that Lightning's demo adapts (clip gradients at 0.25 through the Trainer)."""

    def __init__(
        self, vocab_size: int = 4000, ninp: int = 128, nhid: int = 128, nlayers: int = 2, lr: float = 20.0
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = SimpleLSTM(vocab_size=vocab_size, ninp=ninp, nhid=nhid, nlayers=nlayers, dropout=0.2)
        self.val_perplexity = Perplexity()

    def _log_probs(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        log_probs, _ = self.model(x, self.model.init_hidden(x.shape[0]))
        return log_probs, y.reshape(-1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.nll_loss(*self._log_probs(batch))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        log_probs, targets = self._log_probs(batch)
        self.log("val_loss", F.nll_loss(log_probs, targets), prog_bar=True)
        self.val_perplexity(log_probs.unsqueeze(0), targets.unsqueeze(0))  # softmax of log-probabilities: themselves
        self.log("val_ppl", self.val_perplexity)  # accumulated over the epoch, synced across ranks

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
