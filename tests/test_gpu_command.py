"""The GPU command's dry run on the CPU: every part runs at a tiny size through the code the GPU runs, the
CUDA-only checks are skipped by name, results are written as each part ends, and a second call resumes from them
(running nothing already done)."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_a_second_call_resumes(tmp_path):
    done = gpu.run(list(gpu.PARTS), tmp_path, budget_min=5, dry=True)
    mechanics = json.loads((tmp_path / "mechanics.json").read_text())
    for part, (_, _, cpu_reason) in gpu.MECHANICS.items():
        result = mechanics[part]
        assert "error" not in result, (part, result)
        if cpu_reason is not None:
            assert result == {"skipped": cpu_reason}  # by name, with the reason
    assert mechanics["memory"]["predicted_steps"] > 0 and len(mechanics["memory"]["allocated_along_the_run"]) > 1
    assert {phase for _, phase, _ in mechanics["memory"]["allocated_along_the_run"]} >= {"full", "predict"}
    assert set(mechanics["offload"]) == {"none", "offload", "aggressive"}
    assert set(mechanics["outer_memory"]) == {"plain", "outer_norm_restart", "state_on_host"}
    assert mechanics["outer_memory"]["state_on_host"]["jumps_made"] >= 2
    overheads = json.loads((tmp_path / "overheads.json").read_text())["result"]
    assert {"backed_off", "tracking", "outer", "outer_on_host"} <= set(overheads["hybrid_over_plain"])
    record = json.loads((tmp_path / "gpt2.json").read_text())
    # 3 compared rates x 3 seeds x (plain, the default), and plain alone at 2 more rates
    assert record["complete"] and len(record["runs"]) == gpu.GPT2_RUNS == 3 * 3 * 2 + 2 and record["plan"]["steps"] == 8
    rates = [record["plan"]["lr"] * factor for factor in (1, 1 / 3, 3)]
    assert set(record["comparisons"]) == {f"lr{lr:.3g}_{c}" for lr in rates for c in gpu.GPT2_CONFIGS}
    assert all(None not in row["loss_equal_steps"] for row in record["comparisons"].values())
    finals = record["sweep"]["final_val_loss_by_lr"]
    assert len(finals) == 5 and record["sweep"]["tuned_lr"] == min(finals, key=finals.get)
    assert "| gpt2 |" in (tmp_path / "README.md").read_text()
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")}
    again = gpu.run(list(gpu.PARTS), tmp_path, budget_min=5, dry=True)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")} == stamps  # nothing re-run
    assert again["gpt2"]["runs"] == done["gpt2"]["runs"]


def test_a_failing_part_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(call):
        raise RuntimeError("out of memory, say")

    monkeypatch.setitem(gpu.MECHANICS, "offload", (broken, 0.0, None))
    monkeypatch.setitem(gpu.MECHANICS, "memory", (lambda call: {"ran": True}, 0.0, None))
    done = gpu.run(["offload", "memory", "sync"], tmp_path, budget_min=1, dry=True)
    assert "out of memory, say" in done["mechanics"]["offload"]["error"]
    assert done["mechanics"]["memory"] == {"ran": True} and "skipped" in done["mechanics"]["sync"]
