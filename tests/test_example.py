"""The example scripts train end to end (a few steps here; the README runs them in full), on local data."""

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from lightning_hybrid.demos.digits_cnn import DigitsData
from lightning_hybrid.demos.gpt import byte_ids, stdlib_corpus
from lightning_hybrid.demos.splits import TokenWindows
from lightning_hybrid.demos.word_lstm import PydocWords, pydoc_words

ROOT = Path(__file__).resolve().parents[1]


def test_corpus_is_deterministic_and_local():
    a, b = stdlib_corpus(50_000), stdlib_corpus(50_000)
    assert a == b and len(a) == 50_000
    x, y = TokenWindows(byte_ids(a), 16)[3]
    assert x.shape == y.shape == (16,) and torch_equal_shifted(a, x, y)


def torch_equal_shifted(data, x, y):
    return bytes(x[1:].tolist()) == bytes(y[:-1].tolist()) and bytes(x.tolist()) == data[48:64]


def run_example(script: str, *args: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m examples.<script> *args``, in this process (a process of its own costs seconds of imports)."""
    module = importlib.import_module(f"examples.{script}")
    monkeypatch.setattr(sys, "argv", [f"examples/{script}.py", *args])
    module.main()


def test_example_script_runs_and_writes_its_summary(tmp_path, capfd, monkeypatch):
    """The default only: the per-step predictors train through Lightning in test_resume and the golden runs."""
    predictor = "outer"
    run_example(
        "char_gpt", "--max-steps", "6", "--root", str(tmp_path), "--predictor", predictor, monkeypatch=monkeypatch
    )
    assert "final val_loss" in capfd.readouterr().out
    summaries = list(tmp_path.rglob("hybrid_summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    assert summary["steps_total"] == 6 and summary["predictor"] == predictor


def test_word_corpus_and_vocabulary_are_deterministic():
    assert pydoc_words() == pydoc_words()
    a, b = PydocWords(vocab_size=500), PydocWords(vocab_size=500)
    a.setup("fit"), b.setup("fit")
    x, y = a.train_set[5]
    assert x.equal(b.train_set[5][0]) and x[1:].equal(y[:-1])
    assert int(a.train_set.ids.max()) < 500 and len(a.val_set) > 0


def test_digits_split_is_seeded_and_disjoint():
    a, b, c = DigitsData(seed=0), DigitsData(seed=0), DigitsData(seed=1)
    for d in (a, b, c):
        d.setup("fit")
    assert a.val_set.indices == b.val_set.indices != c.val_set.indices
    assert not set(a.val_set.indices) & set(a.train_set.indices)
    assert len(a.val_set) == int(1797 * 0.2)


@pytest.mark.parametrize("script", ["digits_cnn", "word_lstm", "finetune"])
def test_other_example_scripts_run(tmp_path, capfd, monkeypatch, script):
    args = ["--pretrain-steps", "3"] if script == "finetune" else []  # a quick pretraining, cached in tmp_path
    monkeypatch.setenv("LIGHTNING_HYBRID_CACHE", str(tmp_path / "cache"))
    run_example(script, "--max-steps", "6", "--root", str(tmp_path), *args, monkeypatch=monkeypatch)
    assert "final val_loss" in capfd.readouterr().out
    (summary,) = tmp_path.rglob("hybrid_summary.json")
    assert json.loads(summary.read_text())["steps_total"] == 6


def test_the_demos_report_torchmetrics_validation_metrics():
    """Perplexity accumulated by torchmetrics is exp of the epoch's mean validation loss (equal-sized batches);
    digits accuracy is a fraction of the validation set."""
    import math

    import lightning as L

    from lightning_hybrid.demos.char_gpt import CharGPT, StdlibText
    from lightning_hybrid.demos.digits_cnn import DigitsCNN

    trainer = L.Trainer(max_steps=2, limit_val_batches=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    model, data = CharGPT(n_layer=1, n_embd=32), StdlibText(max_bytes=20000)
    trainer.fit(model, data)
    metrics = trainer.validate(model, data, verbose=False)[0]
    assert metrics["val_ppl"] == pytest.approx(math.exp(metrics["val_loss"]), rel=1e-4)
    digits = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    result = digits.validate(DigitsCNN(), DigitsData(), verbose=False)[0]
    assert 0.0 <= result["val_acc"] <= 1.0


def test_the_gpt_demos_fuse_adamw_where_fused_says():
    """``fused``: None fuses AdamW on GPUs only (so on this CPU, not), True or False as given, anything else is
    refused by name; MuonGPT's AdamW follows it too."""
    from lightning_hybrid.demos.char_gpt import CharGPT
    from lightning_hybrid.demos.muon_gpt import MuonGPT

    def fused(model):
        optimizers = model.configure_optimizers()
        optimizers = optimizers[0] if isinstance(optimizers, tuple) else [optimizers["optimizer"]]
        return [opt.defaults.get("fused") for opt in optimizers if isinstance(opt, torch.optim.AdamW)]

    assert fused(CharGPT(n_layer=1, n_embd=32)) == [False]
    assert fused(CharGPT(n_layer=1, n_embd=32, fused=True)) == [True]
    assert fused(MuonGPT(n_layer=1, n_embd=32, fused=True)) == [True]
    with pytest.raises(ValueError, match=r"CharGPT: `fused` must be True, False or None .*got 'yes'"):
        CharGPT(fused="yes")


def test_the_muon_example_trains_two_optimizers_as_one_trajectory(tmp_path, capfd, monkeypatch):
    run_example("muon_gpt", "--max-steps", "4", "--root", str(tmp_path), monkeypatch=monkeypatch)
    (path,) = tmp_path.rglob("hybrid_summary.json")
    summary = json.loads(path.read_text())
    assert summary["steps_total"] == 4 and summary["mode"] == "jumps" and "stepped_aside" not in summary
    out = capfd.readouterr()
    assert "trained 4 batches (8 optimizer steps)" in out.out  # --max-steps counts batches, and says so
    assert "it/s]" in out.out + out.err and "Epoch 0/-2" not in out.out + out.err  # the hybrid bar (TQDM), not Rich
