"""The harness across learning rates, end to end on a tiny task: the plain sweep picks the tuned rate, the grid
runs plain against each configuration at three rates (the peers at two), goes on where it stopped, and the report
writes one table and one plot per task."""

from __future__ import annotations

import pytest

from benchmarks import lrs, lrs_report
from benchmarks.lrs import LrTask


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setattr(lrs, "OUT", tmp_path)
    monkeypatch.setattr(lrs_report, "OUT", tmp_path)
    monkeypatch.setitem(lrs.LR_TASKS, "tiny", LrTask("digits_cnn", 20, 1))
    return tmp_path


@pytest.mark.slow
def test_sweep_grid_and_report_on_a_tiny_task(tiny):
    best = lrs.sweep("tiny")
    assert best == lrs.tuned("tiny")
    assert len(list((tiny / "tiny").glob("*_plain.json"))) == len(lrs.SWEEP)
    plan = lrs.grid_plan("tiny", ["search", "ema", "schedulefree"])
    assert [(round(lr / best, 3), configs) for lr, _, configs in plan] == [
        (0.333, ["search", "ema", "schedulefree"]),
        (1.0, ["search", "ema", "schedulefree"]),
        (3.0, ["search"]),
    ]
    lrs.grid("tiny", ["search", "ema", "schedulefree"])
    files = sorted(p.name for p in (tiny / "tiny").glob("*.json"))
    assert sum(name.endswith("_search.json") for name in files) == 3
    assert sum(name.endswith(("_ema.json", "_schedulefree.json")) for name in files) == 4
    stamp = {p: p.stat().st_mtime_ns for p in (tiny / "tiny").glob("*.json")}
    lrs.grid("tiny", ["search", "ema", "schedulefree"])  # nothing left to run: no file rewritten
    assert {p: p.stat().st_mtime_ns for p in (tiny / "tiny").glob("*.json")} == stamp
    text = lrs_report.report(["tiny"])
    assert "plain at the tuned lr" in text and "`search`" in text and "`schedulefree`" in text
    assert (tiny / "tiny.md").exists() and (tiny / "tiny.png").stat().st_size > 0
