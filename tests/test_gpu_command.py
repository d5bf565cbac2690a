"""The GPU command's dry run on the CPU: every part runs at a tiny size through the code the GPU runs, the
CUDA-only checks are skipped by name, results are written as each part ends, and a second call resumes from them
(running nothing already done)."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu
from tests.helpers import written


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_a_second_call_resumes(tmp_path, monkeypatch):
    """The profile here jumps on cycles of 5 steps after 5, not 20 after 20, and profiles one step, not 20 (torch
    parses the 10,000 CPU events of each at about a second a step): step 15, the second cycle's end, as in the GPU's
    window (45-65). Its fits end at step 16, past the first jump's verdict: a fit that ends before it makes no jump."""
    assert gpu.BUSY_STEPS == 20  # the GPU's window
    cycles = ("hybrid.warmup_steps", "hybrid.full_steps", "model.warmup_steps")
    short = [*(o for o in gpu.JUMPING if not o.startswith(cycles)), *(f"{o}={n}" for o, n in zip(cycles, (5, 5, 2)))]
    monkeypatch.setattr(gpu, "JUMPING", short)  # the profile's alone: the overheads' modes keep theirs
    monkeypatch.setattr(gpu, "BUSY_START", 14)
    monkeypatch.setattr(gpu, "BUSY_STEPS", 1)
    monkeypatch.setattr(gpu, "QUALITY_SEEDS", 2)  # an even seed and an odd: both places of plain rehearsed
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
    cells = json.loads((tmp_path / "overheads.json").read_text())["cells"]
    assert set(cells) == set(gpu.OVERHEAD_CELLS)
    for cell, (_, modes) in gpu.OVERHEAD_CELLS.items():
        assert set(cells[cell]["steady_hybrid_over_plain"]) == set(modes) and cells[cell]["clock"] == "cpu_s"
        kept = cells[cell]["kept"]  # each mode did what it is named for: no jump, or a jump made
        assert kept["default_aside"] == [{"jumps": 0, "blind": 1}] and kept["default_jumping"][0]["jumps"] >= 1
    profiled = json.loads((tmp_path / "profile.json").read_text())["result"]
    assert profiled["on_device"]["jump"]["calls"] >= 1 and profiled["on_device"]["tensors"] == 149  # the 85M's
    assert profiled["on_device"]["jump"]["parameter_copies"] >= 3  # the weights, the anchor, the momentum at least
    assert profiled["on_host"]["jump"]["ops"] > profiled["on_device"]["jump"]["ops"]  # the copies in and out
    assert profiled["on_device"]["busy"]["steps"] == 1 and profiled["on_device"]["busy"]["wall_s"] > 0
    grid = json.loads((tmp_path / "grid.json").read_text())  # the GPU grid's code on one tiny cell, 2 seeds
    assert grid["complete"] == ["dry_1.5tpp default+nudged"] and not grid["waiting"]
    blocks = [
        json.loads((tmp_path / "grid" / "dry_1.5tpp" / f"seed{s}_default_nudged.json").read_text()) for s in (0, 1)
    ]
    assert [list(b["runs"]) for b in blocks] == [["plain", "default", "nudged"], ["default", "nudged", "plain"]]
    assert all(r["process"] == blocks[0]["process"] for b in blocks for r in b["runs"].values())  # one process
    assert (
        "| dry_1.5tpp |" in grid["table"]
        and "wall time: default" in grid["table"]
        and "## The grid" in readme_of(tmp_path)
    )
    record = json.loads((tmp_path / "quality.json").read_text())
    for run in record["runs"].values():  # where and when each ran: "paired in one process" checkable from the file
        assert set(run["process"]) == {"host", "pid", "started"} and run["started"] <= run["finished"]
    assert len({run["process"]["pid"] for run in record["runs"].values()}) == 1
    assert set(record["sweep"]) == {f"{lr:.3g}" for lr in gpu.SWEEP_RATES}
    best = record["best_lr"]
    assert record["sweep"][f"{best:.3g}"]["final"] == min(row["final"] for row in record["sweep"].values())
    # the sweep's runs, then both rates x 2 seeds x (plain, the default), plain's seed 0 at the best rate shared, and
    # primal averaging's arm at the best rate against the same plain runs (rehearsed, whether GPA_ARM is on or not)
    assert len(record["runs"]) == len(gpu.SWEEP_RATES) + len(gpu.QUALITY_RATES) * 2 * 2 - 1 + 2
    assert set(record["comparisons"]) == {f"lr{best * f:.3g}" for f in gpu.QUALITY_RATES} | {f"lr{best:.3g}_gpa"}
    assert all(None not in row["loss_equal_steps"] for row in record["comparisons"].values())
    assert record["comparisons"][f"lr{best:.3g}_gpa"]["arm"] == "gpa" and f"{best:.3g} | gpa |" in readme_of(tmp_path)
    order = list(record["runs"])  # as run: plain first in even seeds, last in odd (the process's warm-up shared)
    assert order.index(gpu._key(best, 1, "default")) < order.index(gpu._key(best, 1, "plain"))
    third = best * gpu.QUALITY_RATES[1]  # seed 0's plain at the best rate is the sweep's: at a third, it runs first
    assert order.index(gpu._key(third, 0, "plain")) < order.index(gpu._key(third, 0, "default"))
    for key, row in record["comparisons"].items():  # each seed's jumps, as its run counted them
        lr = float(key.split("_")[0][2:])
        for seed, jumps in enumerate(row["jumps"]):
            counted = record["runs"][gpu._key(lr, seed, row["arm"])]
            assert jumps == {
                "made": counted["segments_started"],
                "kept": counted["jumps_kept"],
                "undone": counted["rollbacks"],
            }
            assert row["whole_run_wall"][seed] > 0
    assert {row["lowest_step"] for row in record["sweep"].values()} <= {p["step"] for p in run_points(record)}
    run = next(iter(record["runs"].values()))
    assert run["data"]["passes"] <= 1 and len(run["data"]["sha256"]) == 64  # read once, and which bytes
    assert all("train_loss" in p for p in run["points"])
    readme = (tmp_path / "README.md").read_text()
    assert "## Quality" in readme and "## Sweep" in readme and "## Profile" in readme
    assert gpu.plan(done, dry_grid=tmp_path / "grid") == []  # nothing left
    stamps = written(tmp_path.glob("*.json"))
    again = gpu.run([*gpu.PARTS, *gpu.MECHANICS], tmp_path, budget_min=5, dry=True)
    assert written(tmp_path.glob("*.json")) == stamps  # nothing re-run
    assert again["quality"]["runs"] == done["quality"]["runs"]


def readme_of(folder):
    return (folder / "README.md").read_text()


def run_points(record):
    return next(iter(record["runs"].values()))["points"]


def test_report_rewrites_the_readme_from_the_files_and_runs_nothing(tmp_path, monkeypatch):
    lr = gpu.SWEEP_RATES[1]
    runs = _sweep_runs({rate: [3.0, 2.0 + abs(rate - lr)] for rate in gpu.SWEEP_RATES})
    for run in runs.values():
        run["points"] = [p | {"step": 10 * (i + 1)} for i, p in enumerate(run["points"])]
    (tmp_path / "quality.json").write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(gpu, "run", lambda *args: pytest.fail("--report ran a part"))
    gpu.main(["--report", "--out", str(tmp_path)])
    assert f"| {lr:.3g} | 2.0000 | 2.0000 (20) | no |" in readme_of(tmp_path)


def test_the_busy_share_counts_kernels_once_not_the_annotations_around_them():
    """The profiler mirrors a ``record_function`` range (``Optimizer.step``) onto the GPU's timeline, spanning the
    kernels it launched: summed with them, the share passed 100% on an H200."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from benchmarks.jump_cost import device_busy_s

    def event(name, start, end, device=DeviceType.CUDA, annotation=False):
        return FunctionEvent(
            0, name, 0, start, end, device_type=device, use_device="cuda", is_user_annotation=annotation
        )

    kernels = [event("gemm", 100, 400), event("adamw", 500, 700)]
    around = [event("Optimizer.step#AdamW.step", 50, 900, annotation=True), event("aten::mm", 0, 1000, DeviceType.CPU)]
    assert device_busy_s([*kernels, *around]) == pytest.approx(500e-6)


def _sweep_runs(finals: dict[float, list[float]]) -> dict[str, dict]:
    return {gpu._key(lr, 0, "plain"): {"points": [{"val_loss": v} for v in losses]} for lr, losses in finals.items()}


def test_the_best_rate_is_the_lowest_final_loss_of_a_curve_that_does_not_turn_up():
    low, mid, high = gpu.SWEEP_RATES
    assert gpu.best_rate(_sweep_runs({low: [3.0, 2.0], mid: [3.0, 1.5]})) is None  # not every rate has run
    falling = {low: [3.0, 2.0], mid: [3.0, 1.8], high: [3.0, 1.9]}
    assert gpu.best_rate(_sweep_runs(falling)) == mid
    memorising = falling | {mid: [3.0, 1.2, 1.7]}  # lowest at its end is 1.7 < 1.8, but it rose from 1.2
    assert gpu.best_rate(_sweep_runs(memorising)) == high


def test_the_plan_is_printed_first_and_each_call_takes_what_fits_its_budget(capsys, monkeypatch, tmp_path):
    """The grid first, its decisive cells first (the sizes at 1.5 tokens a parameter, then the longer cells, then
    primal averaging at each size's longest), each estimated from its steps; then the 85M's parts in their order:
    the first call (``BUDGET_MIN``, at most 6.5 minutes) of the 85M plan runs plain's sweep, the default against
    plain at its best rate and the profile, or primal averaging's arm where it is on; the second (5 minutes) the
    default at a third of the best rate and the overheads; ``main`` prints the plan first."""
    from benchmarks import scale

    monkeypatch.setattr(scale, "GPU_OUT", tmp_path)  # no grid run in yet
    grid = [(what, minutes) for part, what, minutes in gpu.plan(gpa=False) if part == "grid"]
    cells = ["3.3M_1.5tpp", "17M_1.5tpp", "43M_1.5tpp", "3.3M_6tpp", "17M_6tpp", "3.3M_6tpp", "17M_6tpp", "43M_1.5tpp"]
    assert [what.split(" ")[0] for what, _ in grid] == cells and "gpa" in grid[-1][0]
    first = gpu.this_call([("grid", *row) for row in grid], gpu.BUDGET_MIN, dry=False)
    assert first and sum(minutes for *_, minutes in first) <= gpu.BUDGET_MIN  # the 3.3M cell, then what fits
    assert [p for p, _, _ in gpu.plan(gpa=False) if p != "grid"][-2:] == ["overheads", "overheads_adamw"]
    assert set(gpu.NEXT) == {"grid", "profile", "overheads_adamw"}  # what the 2026-11-28 run left
    rows = [row for row in gpu.plan(gpa=False) if row[0] != "grid"]
    assert [part for part, _, _ in rows] == ["sweep", "quality", "profile", "quality", "overheads", "overheads_adamw"]
    first = gpu.this_call(rows, gpu.BUDGET_MIN, dry=False)
    assert [part for part, _, _ in first] == ["sweep", "quality", "profile"]
    assert sum(minutes for *_, minutes in first) <= gpu.BUDGET_MIN <= 6.5
    with_gpa = gpu.this_call([r for r in gpu.plan(gpa=True) if r[0] != "grid"], gpu.BUDGET_MIN, dry=False)
    assert [part for part, _, _ in with_gpa] == ["sweep", "quality", "quality_gpa"]  # the profile waits
    swept = _sweep_runs({lr: [3.0, 2.0 - lr] for lr in gpu.SWEEP_RATES})
    best = max(gpu.SWEEP_RATES)
    runs = {gpu._key(best, s, c): {} for s in range(gpu.QUALITY_SEEDS) for c in ("plain", "default")} | swept
    done = {"profile": {"result": {"on_device": {}}}, "quality": {"runs": runs}}
    second = gpu.this_call([r for r in gpu.plan(done, gpa=False) if r[0] != "grid"], 5, dry=False)
    assert [what for _, what, _ in second] == [
        f"85M at {best / 3:.3g}, a third of {best:.3g}: plain and the default, 3 seeds",
        gpu.OVERHEAD_WHAT["85M"],
    ]
    assert sum(minutes for *_, minutes in second) <= 5
    monkeypatch.setattr(gpu, "run", lambda *args: {name: {} for name in gpu.FILES})
    gpu.main(["--dry-run", "--out", "unused"])
    printed = capsys.readouterr().out
    assert printed.startswith("plan (dry run") and "this call ~" in printed.split("# The GPU")[0]


def test_a_named_mechanics_part_takes_its_minutes_from_the_calls_budget(tmp_path, monkeypatch):
    """A budget that fits the 85M plan's first two rows fits one once the kernels' check (not yet done) is named."""
    from benchmarks import scale

    monkeypatch.setattr(scale, "GPU_OUT", tmp_path)
    rows = [row for row in gpu.plan(gpa=False) if row[0] != "grid"]
    budget = rows[0][2] + rows[1][2] + 0.01
    assert "this call: the first 2" in gpu.plan_text(["sweep", "quality"], budget)
    assert "this call: the first 1" in gpu.plan_text(["kernels", "sweep", "quality"], budget)
    done = {"mechanics": {"kernels": {"passed": True}}}  # done: it takes nothing
    assert "this call: the first 2" in gpu.plan_text(["kernels", "sweep", "quality"], budget, done=done)


def test_a_failing_part_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(call):
        raise RuntimeError("out of memory, say")

    monkeypatch.setitem(gpu.MECHANICS, "offload", (broken, 0.0, None))
    monkeypatch.setitem(gpu.MECHANICS, "memory", (lambda call: {"ran": True}, 0.0, None))
    done = gpu.run(["offload", "memory", "sync"], tmp_path, budget_min=1, dry=True)
    assert "out of memory, say" in done["mechanics"]["offload"]["error"]
    assert done["mechanics"]["memory"] == {"ran": True} and "skipped" in done["mechanics"]["sync"]


def test_the_overheads_85m_is_the_gpt2_task(tmp_path):
    """The part's 85M composes the GPT-2-shaped task's model and data (its corpus read once)."""
    from benchmarks.harness import gpt_config
    from benchmarks.tasks import compose_run

    ours = gpt_config("85M", 10, str(tmp_path), [])
    task = compose_run("char_gpt_gpt2", "quick", 0, [], str(tmp_path))
    for key in ("n_layer", "n_head", "n_embd"):
        assert ours.model[key] == task.model[key], key
    assert ours.data == task.data


def test_the_85m_parameter_count_the_record_divides_by_is_the_models(tmp_path):
    import hydra

    from benchmarks.harness import gpt_config

    model = hydra.utils.instantiate(gpt_config("85M", 10, str(tmp_path), []).model)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == gpu.PARAMETERS


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


def test_the_stored_comparisons_are_what_the_runs_give():
    """A comparison's stored fields (the jumps made, kept and undone among them) are recomputed from its runs."""
    from benchmarks.harness import RESULTS

    checked = 0
    for path in sorted((RESULTS / "gpu").glob("*/quality.json")):
        record = json.loads(path.read_text())
        if record.get("runs") and record.get("best_lr") is not None:
            assert record["comparisons"] == gpu.comparisons(record["runs"], record["best_lr"]), path.parent.name
            checked += 1
    assert checked


def test_the_bytes_an_operation_moves_are_its_arguments_read_and_its_result_written():
    """The count behind a jump's bytes: an in-place ``_foreach_`` op (which returns nothing) writes what it updates."""
    import torch

    from benchmarks.jump_cost import Count

    a, b = [torch.ones(3), torch.ones(5)], [torch.ones(3), torch.ones(5)]
    with Count() as count:
        torch._foreach_add_(a, b)  # reads a and b, writes a: three lists of 8 floats
        norms = torch._foreach_norm(a)  # reads a, writes two scalars
    assert count.bytes == 3 * 8 * 4 + 8 * 4 + 2 * 4 and len(norms) == 2


def test_the_grid_takes_the_best_rate_among_curves_lowest_in_their_last_tenth():
    """A curve lowest before its last tenth gives no time to its final loss: the GPU grid's sweep passes it over,
    however low it ends, unless every curve is such."""
    from benchmarks import scale

    def curve(*losses):
        return {"points": [{"val_loss": v} for v in losses]}

    settled, early = curve(3.0, 2.0, 1.5, 1.40), curve(3.0, 1.0, 1.2, 1.35)
    assert scale.tuned({"0.001": settled, "0.002": early}) == 0.002  # the CPU grid's rule: the lowest final loss
    assert scale.tuned({"0.001": settled, "0.002": early}, settled=True) == 0.001
    assert scale.tuned({"0.002": early, "0.004": curve(3.0, 1.1, 1.3, 1.5)}, settled=True) == 0.002
