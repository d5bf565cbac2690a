"""The GPU command's dry run on the CPU: every part runs at a tiny size through the code the GPU runs, the
CUDA-only checks are skipped by name, results are written as each part ends, and a second call resumes from them
(running nothing already done)."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_a_second_call_resumes(tmp_path):
    done = gpu.run([*gpu.PARTS, *gpu.MECHANICS], tmp_path, budget_min=5, dry=True)
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
    assert set(overheads) == set(gpu.OVERHEAD_CELLS)
    for cell, (_, _, modes) in gpu.OVERHEAD_CELLS.items():
        assert set(overheads[cell]["hybrid_over_plain"]) == set(modes) and overheads[cell]["clock"] == "cpu_s"
        kept = overheads[cell]["kept"]  # each mode did what it is named for: no jump, or a jump made
        assert kept["default_aside"] == [{"jumps": 0, "blind": 1}] and kept["default_jumping"][0]["jumps"] >= 1
    record = json.loads((tmp_path / "quality.json").read_text())
    # both rates x 3 seeds x (plain, the default): the dry run plans every rate
    assert record["complete"] and len(record["runs"]) == len(gpu.QUALITY_RATES) * gpu.QUALITY_SEEDS * 2
    assert set(record["comparisons"]) == {f"lr{gpu.QUALITY_LR * f:.3g}" for f in gpu.QUALITY_RATES}
    assert all(None not in row["loss_equal_steps"] for row in record["comparisons"].values())
    assert "| quality |" in (tmp_path / "README.md").read_text()
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")}
    again = gpu.run([*gpu.PARTS, *gpu.MECHANICS], tmp_path, budget_min=5, dry=True)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")} == stamps  # nothing re-run
    assert again["quality"]["runs"] == done["quality"]["runs"]


def test_the_plan_fits_one_call_and_is_printed_before_anything_runs(capsys, monkeypatch):
    """The call's two parts fit ``BUDGET_MIN`` on an H200 by the plan's own estimate, the tuned rate always runs,
    and ``main`` prints the plan first."""
    rows = gpu.plan()
    assert [part for part, _, _ in rows][:3] == ["overheads", "overheads", "quality"]
    assert sum(minutes for _, _, minutes in rows) <= gpu.BUDGET_MIN <= 9.0
    assert gpu.quality_rates()[0] == 1.0 and gpu.quality_rates(dry=True) == list(gpu.QUALITY_RATES)
    done = {"overheads": {"result": {"85M": {}}}, "quality": {"runs": _runs(gpu.QUALITY_LR)}}
    second = gpu.plan(done=done)  # the next call: what the first had no room for
    assert [what for _, what, _ in second] == [f"85M at {gpu.QUALITY_LR / 3:.3g}: plain and the default, 3 seeds"]
    monkeypatch.setattr(gpu, "run", lambda *args: {"mechanics": {}, "overheads": {}, "quality": {}})
    gpu.main(["--dry-run", "--out", "unused"])
    printed = capsys.readouterr().out
    assert printed.startswith("plan (dry run") and "total ~" in printed.split("# The GPU")[0]


def _runs(lr: float) -> dict[str, dict]:
    """A quality record's runs at ``lr``, every seed, as the part names them."""
    return {f"lr{lr:.3g}_seed{s}_{c}": {} for s in range(gpu.QUALITY_SEEDS) for c in ("plain", "default")}


def test_a_rate_added_to_the_plan_runs_although_the_record_says_complete(tmp_path, monkeypatch):
    """A record completed under another rate (the tuned rate moved) still runs the rates it lacks; one holding
    every planned rate runs nothing."""
    tuned, third = _runs(gpu.QUALITY_LR), _runs(gpu.QUALITY_LR / 3)
    (tmp_path / "quality.json").write_text(json.dumps({"runs": tuned, "complete": True}))
    (tmp_path / "overheads.json").write_text(json.dumps({"result": {"85M": {}}}))
    asked: list[list[float]] = []
    monkeypatch.setattr(gpu, "quality", lambda call, record, save, rates: asked.append(rates) or record)
    gpu.run(["overheads", "quality"], tmp_path, budget_min=1, dry=False)
    assert asked == [[1.0, 1 / 3]]  # the missing third is planned; the tuned rate's runs are not repeated
    (tmp_path / "quality.json").write_text(json.dumps({"runs": tuned | third}))
    gpu.run(["overheads", "quality"], tmp_path, budget_min=1, dry=False)
    assert len(asked) == 1


def test_a_failing_part_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(call):
        raise RuntimeError("out of memory, say")

    monkeypatch.setitem(gpu.MECHANICS, "offload", (broken, 0.0, None))
    monkeypatch.setitem(gpu.MECHANICS, "memory", (lambda call: {"ran": True}, 0.0, None))
    done = gpu.run(["offload", "memory", "sync"], tmp_path, budget_min=1, dry=True)
    assert "out of memory, say" in done["mechanics"]["offload"]["error"]
    assert done["mechanics"]["memory"] == {"ran": True} and "skipped" in done["mechanics"]["sync"]


def test_the_overheads_sizes_are_the_harness_sizes_and_85m_is_the_gpt2_task(tmp_path):
    """The part names its sizes by the harness's table; 85M composes the GPT-2-shaped task's model and data."""
    from benchmarks.harness import SIZES, gpt_config
    from benchmarks.tasks import compose_run

    assert {size for size, _, _ in gpu.OVERHEAD_CELLS.values()} <= set(SIZES)
    ours = gpt_config("85M", 10, str(tmp_path), [])
    task = compose_run("char_gpt_gpt2", "quick", 0, [], str(tmp_path))
    for key in ("n_layer", "n_head", "n_embd"):
        assert ours.model[key] == task.model[key], key
    assert ours.data.block_size == task.data.block_size and ours.data.batch_size == task.data.batch_size


def test_plain_against_the_modes_takes_the_common_overrides_too(tmp_path, monkeypatch):
    """On the GPU the part runs in bf16 (``trainer=gpu``): plain, which runs first, must too, or the ratio compares
    precisions."""
    from benchmarks import harness

    class Composed(Exception):
        pass

    def config(size, steps, workdir, extra):
        raise Composed(list(extra))

    monkeypatch.setattr(harness, "gpt_config", config)
    with pytest.raises(Composed) as plain:
        harness.against_plain("1M", 2, 1, str(tmp_path), gpu.OVERHEAD_MODES, ["trainer=gpu"])
    assert plain.value.args[0] == ["trainer=gpu"]
