"""Fine-tuning with the plugin on a ``peft`` model: only the LoRA adapters are trainable, predicted and rolled back;
the pretrained base weights stay bitwise as they were; checkpoint and resume are exact. And the pretrained weights
are built once, deterministically, and cached."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_hybrid import DivergenceMonitor, DynamicsPredictor, HybridScheduler, ResidualCorrector
from lightning_hybrid.demos.finetune import FineTuneGPT, PydocText, fingerprint, pretrained_weights
from tests.helpers import FAST_PHASES, SometimesExploding, by_step, hybrid_trainer, scheduler_of

pytest.importorskip("peft")
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, pretrain_steps=5, lr=1e-2, max_steps=40)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTNING_HYBRID_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _data() -> DataLoader:
    data = PydocText(block_size=16, batch_size=8)
    data.setup("fit")
    return DataLoader(torch.utils.data.Subset(data.train_set, range(16)), batch_size=8)  # 2 steps an epoch


def test_pretrained_weights_are_built_once_and_the_same_each_time():
    first = pretrained_weights(1, 2, 32, 16, 5)
    again = pretrained_weights(1, 2, 32, 16, 5)  # from the cache
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    model = FineTuneGPT(mode="full", **TINY)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in first.items())


def test_pretrained_weights_do_not_depend_on_the_callers_threads(tmp_path, monkeypatch):
    built, before = [], torch.get_num_threads()
    try:
        for threads in (2, 1):  # at this width a product sums in another order on two threads
            monkeypatch.setenv("LIGHTNING_HYBRID_CACHE", str(tmp_path / f"cache{threads}"))
            torch.set_num_threads(threads)
            built.append(pretrained_weights(2, 4, 128, 64, 1))
            assert torch.get_num_threads() == threads  # the caller's setting, back
    finally:
        torch.set_num_threads(before)  # the rest of the suite runs as it would have
    assert fingerprint(built[0]) == fingerprint(built[1])
    assert all(torch.equal(built[0][k], built[1][k]) for k in built[0])
    built[1]["head.weight"][0, 0] += 1e-6
    assert fingerprint(built[0]) != fingerprint(built[1])


def test_lora_trains_only_the_adapters():
    model = FineTuneGPT(mode="lora", **TINY)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0] for n in trainable} == {f"blocks.0.{t}" for t in ("qkv", "proj", "mlp.0", "mlp.2")}


def _base(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def _adapters(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "lora_" in n])


def _phase(path) -> int:
    callbacks = torch.load(path, weights_only=True)["callbacks"]
    return next(v for k, v in callbacks.items() if k.startswith("HybridScheduler"))["machine"]["phase"]


def _run(root, ckpt_path=None):
    """Predict segments of the adapters, a third of them blown up and rolled back; a checkpoint every epoch."""
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=2, filename="{step}")
    hybrid = [HybridScheduler(**FAST_PHASES), DynamicsPredictor(SometimesExploding()), ResidualCorrector()]
    trainer, _ = hybrid_trainer(
        40,
        hybrid=[*hybrid, DivergenceMonitor()],
        extra_callbacks=[checkpoint] if ckpt_path is None else [],
        enable_checkpointing=ckpt_path is None,
        logger=False,
        default_root_dir=root,
    )
    torch.manual_seed(0)  # the adapters' initialisation: a seed whose run rolls a segment back in 40 steps
    model = FineTuneGPT(mode="lora", **TINY)
    trainer.fit(model, _data(), ckpt_path=ckpt_path)
    return model, trainer


def test_the_plugin_predicts_and_rolls_back_only_the_adapters_and_resumes_exactly(tmp_path):
    torch.manual_seed(0)
    base = _base(FineTuneGPT(mode="lora", **TINY))
    model, trainer = _run(tmp_path / "full")
    summary = scheduler_of(trainer).summary()
    assert summary["segments_started"] > 0 and summary["rollbacks"] > 0 and summary["backward_skipped"] > 0
    assert all(torch.equal(p, base[n]) for n, p in _base(model).items())  # the base weights: bitwise untouched
    ckpts = by_step(tmp_path / "full" / "ckpt")
    mid = [p for p in ckpts if _phase(p) == 2]
    assert mid, "no checkpoint inside a Predict segment"
    resumed, resumed_trainer = _run(tmp_path / "resumed", mid[0])
    assert torch.equal(_adapters(resumed), _adapters(model))
    assert all(torch.equal(p, base[n]) for n, p in _base(resumed).items())
    assert scheduler_of(resumed_trainer).summary()["rollbacks"] == summary["rollbacks"]


def test_the_store_holds_only_the_adapters():
    seen = []

    class Watch(HybridScheduler):
        def on_train_start(self, trainer, pl_module):
            super().on_train_start(trainer, pl_module)
            names = {id(p): n for n, p in pl_module.named_parameters()}
            seen.extend(names[id(p)] for p in self.engine.store.owners)

    hybrid = [Watch(**FAST_PHASES), DynamicsPredictor(SometimesExploding()), ResidualCorrector(), DivergenceMonitor()]
    trainer, _ = hybrid_trainer(4, hybrid=hybrid, logger=False)
    trainer.fit(FineTuneGPT(mode="lora", **TINY), _data())
    assert seen and all("lora_" in n for n in seen)
