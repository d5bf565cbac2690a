"""The quick-start example trains end to end (a few steps here; the README runs it in full)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.char_gpt import ByteWindows, stdlib_corpus

ROOT = Path(__file__).resolve().parents[1]


def test_corpus_is_deterministic_and_local():
    a, b = stdlib_corpus(50_000), stdlib_corpus(50_000)
    assert a == b and len(a) == 50_000
    x, y = ByteWindows(a, 16)[3]
    assert x.shape == y.shape == (16,) and torch_equal_shifted(a, x, y)


def torch_equal_shifted(data, x, y):
    return bytes(x[1:].tolist()) == bytes(y[:-1].tolist()) and bytes(x.tolist()) == data[48:64]


@pytest.mark.parametrize("predictor", ["linear", "mlp", "rssm"])
def test_example_script_runs_and_writes_its_summary(tmp_path, predictor):
    cmd = [sys.executable, "-m", "examples.char_gpt", "--max-steps", "30", "--root", str(tmp_path)]
    cmd += ["--predictor", predictor]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final val_loss" in out.stdout
    summaries = list(tmp_path.rglob("hybrid_summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    assert summary["steps_total"] == 30 and summary["predictor"] == predictor
