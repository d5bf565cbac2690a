"""The example scripts train end to end (a few steps here; the README runs them in full), on local data."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_hybrid.demos.char_gpt import byte_ids, stdlib_corpus
from lightning_hybrid.demos.digits_cnn import DigitsData
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


@pytest.mark.slow
def test_example_script_runs_and_writes_its_summary(tmp_path):
    """The default only: the per-step predictors train through Lightning in test_resume and the golden runs."""
    predictor = "outer"
    cmd = [sys.executable, "-m", "examples.char_gpt", "--max-steps", "30", "--root", str(tmp_path)]
    cmd += ["--predictor", predictor]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final val_loss" in out.stdout
    summaries = list(tmp_path.rglob("hybrid_summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    assert summary["steps_total"] == 30 and summary["predictor"] == predictor


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


@pytest.mark.slow
@pytest.mark.parametrize("script", ["digits_cnn", "word_lstm", "finetune"])
def test_other_example_scripts_run(tmp_path, script):
    cmd = [sys.executable, "-m", f"examples.{script}", "--max-steps", "20", "--root", str(tmp_path)]
    cmd += ["--pretrain-steps", "5"] if script == "finetune" else []  # a quick pretraining, cached in tmp_path
    env = {**os.environ, "LIGHTNING_HYBRID_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final val_loss" in out.stdout
    (summary,) = tmp_path.rglob("hybrid_summary.json")
    assert json.loads(summary.read_text())["steps_total"] == 20


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


@pytest.mark.slow
def test_the_muon_example_trains_two_optimizers_as_one_trajectory(tmp_path):
    cmd = [sys.executable, "-m", "examples.muon_gpt", "--max-steps", "30", "--root", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.rglob("hybrid_summary.json")
    summary = json.loads(path.read_text())
    assert summary["steps_total"] == 30 and summary["mode"] == "jumps" and "stepped_aside" not in summary
    assert "trained 30 batches (60 optimizer steps)" in out.stdout  # --max-steps counts batches, and says so
    assert "phase=" in out.stdout and "Epoch 0/-2" not in out.stdout + out.stderr  # the hybrid bar, not Rich
