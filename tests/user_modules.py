"""LightningModules written the way users write them, which the plugin's own test modules are not: the network is
a submodule (``self.net``) that ``training_step`` calls directly, or whose methods it calls, with no ``forward`` of
the LightningModule's own. Hugging Face's GPT-2 (built from a config: nothing is downloaded) and Lightning's demo
LSTM, with token windows to train them on."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import SimpleLSTM
from torch.utils.data import DataLoader, TensorDataset

VOCAB, LENGTH = 64, 16


def token_windows(n: int = 512, seed: int = 1) -> TensorDataset:
    """Windows of random token ids, each with its next-token targets."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, LENGTH + 1), generator=g)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def token_loader(n: int = 512, batch_size: int = 16, seed: int = 1) -> DataLoader:
    return DataLoader(token_windows(n, seed), batch_size=batch_size)


class TokenData(L.LightningDataModule):
    """The token windows shuffled by a loader that Lightning checkpoints mid-epoch: torchdata's ``StatefulDataLoader``
    as users first write it (``"shuffled"``: ``shuffle=True``, in processes seeded apart; on several ranks the
    plugin's strategies give it one permutation, sharded), or with torchdata's ``StatefulDistributedSampler``
    (``"stateful"``, for ``use_distributed_sampler=False``), built here, once the process group is up; or the demos'
    ``ResumableLoader`` (``"resumable"``; Lightning gives it a ``DistributedSampler``)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def train_dataloader(self) -> DataLoader:
        from torchdata.stateful_dataloader import StatefulDataLoader
        from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

        from lightning_hybrid.demos.splits import ResumableLoader

        data = token_windows()
        if self.kind == "shuffled":  # in processes nobody seeded alike: each rank's random state its own
            torch.manual_seed(1 + torch.distributed.get_rank())
            return StatefulDataLoader(data, batch_size=16, shuffle=True)
        if self.kind == "resumable":
            return ResumableLoader(data, batch_size=16, seed=0)
        return StatefulDataLoader(data, batch_size=16, sampler=StatefulDistributedSampler(data, shuffle=True, seed=0))


class NetGPT2(L.LightningModule):
    """Hugging Face's ``GPT2LMHeadModel`` (2 blocks, 32 wide) held as ``self.net``; the step calls it directly."""

    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        # no dropout: a resume is exact only where a step draws no random numbers (Lightning does not checkpoint
        # the random state)
        shape = {"n_embd": 32, "n_layer": 2, "n_head": 2, "bos_token_id": 0, "eos_token_id": 0}
        shape |= {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
        config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, **shape)
        self.net, self.lr = GPT2LMHeadModel(config), lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._loss(batch)

    def _loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(input_ids=x).logits.flatten(0, 1), y.flatten())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(input_ids=batch[0]).logits.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class NetLSTM(L.LightningModule):
    """Lightning's demo ``SimpleLSTM`` held as ``self.net``; the step calls its ``init_hidden`` (which reads a
    parameter) and then the network."""

    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net, self.lr = SimpleLSTM(vocab_size=VOCAB, ninp=16, nhid=16, nlayers=1, dropout=0.0), lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        log_probs, _ = self.net(x, self.net.init_hidden(x.shape[0]))
        return F.nll_loss(log_probs, y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class ManualNetGPT2(NetGPT2):
    """:class:`NetGPT2` under manual optimization: the step's backward and optimizer step run inside it."""

    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__(lr)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss.detach()
