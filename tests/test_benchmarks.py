"""The benchmark harness: its arithmetic, and its quick mode end to end so it cannot rot."""

import json
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from benchmarks.curves import time_to_target, value_at
from benchmarks.run import main
from benchmarks.tasks import TASKS, hybrid_steps

ROOT = Path(__file__).parent.parent


def test_time_to_target_interpolates_between_evaluations():
    xs, losses = [10.0, 20.0, 30.0], [3.0, 2.0, 1.0]
    assert time_to_target(xs, losses, 2.5) == pytest.approx(15.0)
    assert time_to_target(xs, losses, 2.0) == pytest.approx(20.0)
    assert time_to_target(xs, losses, 3.5) == 10.0  # already there at the first evaluation
    assert time_to_target(xs, losses, 0.5) is None  # never reached: no made-up number
    # the *first* crossing counts, even if the loss rises again afterwards
    assert time_to_target([1.0, 2.0, 3.0, 4.0], [3.0, 1.0, 4.0, 0.5], 2.0) == pytest.approx(1.5)


def test_value_at_interpolates_inside_the_evaluated_range_only():
    xs, losses = [10.0, 20.0], [3.0, 2.0]
    assert value_at(xs, losses, 15.0) == pytest.approx(2.5)
    assert value_at(xs, losses, 10.0) == 3.0
    assert value_at(xs, losses, 25.0) is None
    assert value_at(xs, losses, 5.0) is None


def test_hybrid_budget_is_one_and_a_half_times_on_a_validation_boundary():
    for task in TASKS.values():
        for length in task.lengths.values():
            steps = hybrid_steps(length)
            assert steps % length.val_every == 0
            assert 1.5 * length.steps <= steps < 1.5 * length.steps + length.val_every


def _every_run(task: str) -> dict[str, int]:
    """The longest run of each kind the harness makes of ``task``, in batches: every named length with hybrid's
    budget, the learning-rate grid's and, for the 85M task, the GPU command's."""
    from benchmarks import gpu
    from benchmarks.lrs import LR_TASKS
    from benchmarks.tasks import length_of

    runs = {name: hybrid_steps(length) for name, length in TASKS[task].lengths.items()}
    runs |= {
        f"lrs {k}": hybrid_steps(length_of(task, "default", v.steps)) for k, v in LR_TASKS.items() if v.task == task
    }
    if task == "char_gpt_scale":
        from benchmarks.scale import GRIDS, Cell

        runs |= {f"scale {size} {t}": hybrid_steps(Cell(size, t).length) for grid in GRIDS.values() for size, t in grid}
    return runs | ({"gpu": gpu.QUALITY_STEPS} if task == "char_gpt_gpt2" else {})


@pytest.mark.parametrize("task", list(TASKS))
def test_no_benchmark_reads_its_data_more_often_than_its_task_declares(task):
    """A run's passes over its training data, from the task's own DataModule: at most the task's declaration,
    and the 85M task (the GPU's) reads no byte twice."""
    from benchmarks.tasks import data_passes

    passes = {name: data_passes(task, steps) for name, steps in _every_run(task).items()}
    if task == "char_gpt_scale_gpu":  # the GPU grid's cells, each on its batch
        from benchmarks.scale import GPU_GRID, Cell

        cells = [Cell(size, tokens, "gpu") for size, tokens in GPU_GRID]
        passes = {c.name: data_passes(task, hybrid_steps(c.length), c.overrides) for c in cells}
    assert max(passes.values()) <= TASKS[task].passes, passes
    assert TASKS[task].passes < 2 * max(passes.values()), "the declaration is far above what the task reads"
    if task in ("char_gpt_gpt2", "char_gpt_scale"):
        assert TASKS[task].passes == 1


def test_a_run_beyond_its_declared_passes_is_refused_before_it_trains(tmp_path):
    from benchmarks.harness import fit
    from benchmarks.tasks import compose_run, length_of

    cfg = compose_run(
        "char_gpt_gpt2", length_of("char_gpt_gpt2", "quick", 3), 0, ["data.max_bytes=2000"], str(tmp_path)
    )
    with pytest.raises(ValueError, match=r"char_gpt_gpt2: a run of 3.00 passes over its training data; the task "):
        fit(cfg, hybrid=False)


def test_a_plain_curve_that_turns_up_gives_no_time_to_target():
    """Plain's final loss is a target only on a curve that ends near its lowest: where it ends more than 1% above
    it, the comparison keeps its losses but gives no speedup, and the summary counts it apart."""
    from benchmarks.curves import Curve, Point, overfits, rise_at_end
    from benchmarks.harness import Record, compare_seed, summarize

    def record(losses: list[float]) -> Record:
        return Record(
            Curve([Point(10 * (i + 1), i + 1.0, i + 1.0, 10 * (i + 1), v) for i, v in enumerate(losses)]), "cpu", 30
        )

    falling, memorising = [3.0, 2.0, 1.99], [3.0, 1.5, 1.8]
    assert not overfits(falling) and rise_at_end(falling) == 0 and overfits(memorising)
    assert rise_at_end(memorising) == pytest.approx(0.2)
    hybrid = record([2.5, 1.6, 1.5])
    clean, flagged = compare_seed(record(falling), hybrid, 30), compare_seed(record(memorising), hybrid, 30)
    reached = 10 + (2.5 - 1.99) / (2.5 - 1.6) * 10  # hybrid crosses plain's final loss between steps 10 and 20
    assert clean["to_target"]["backward"]["speedup"] == pytest.approx(30 / reached) and not clean["overfitting"]
    assert flagged["overfitting"] and all(v["speedup"] is None for v in flagged["to_target"].values())
    assert flagged["loss_ratio_equal_steps"] == pytest.approx(1.5 / 1.8)  # still measured
    summary = summarize({"seeds": [clean | {"clock": "cpu_s"}, flagged | {"clock": "cpu_s"}]})
    assert summary["overfitting"] == 1 and summary["backward_ratio"]["median"] == pytest.approx(30 / reached)


def _run_quick(tmp_path, *overrides):
    """The quick char GPT task at one layer 32 wide, on batches of 8 windows of 32 bytes: the harness's code, not the
    model's size, is under test."""
    out = tmp_path / "results"
    small = ["model.n_layer=1", "model.n_embd=32", "data.batch_size=8", "data.block_size=32"]
    main(["--task", "char_gpt", "--quick", "--seeds", "2", "--name", "t", "--out", str(out), *overrides, *small])
    return json.loads((out / "char_gpt_quick_t.json").read_text()), out


@pytest.mark.slow
def test_quick_harness_end_to_end(tmp_path):
    result, out = _run_quick(
        tmp_path,
        "predictor=linear",
        "hybrid.warmup_steps=10",
        "hybrid.confidence_threshold=0.0",
        "hybrid.predict_lr_fraction=1.0",
    )
    spec = TASKS["char_gpt"].lengths["quick"]
    assert [s["seed"] for s in result["seeds"]] == [0, 1]
    for seed in result["seeds"]:
        base, hyb = seed["baseline"], seed["hybrid"]
        assert seed["clock"] == "cpu_s"
        assert [p["step"] for p in base["points"]] == list(range(spec.val_every, spec.steps + 1, spec.val_every))
        assert base["points"][-1]["backward"] == spec.steps  # plain: one backward pass per step
        assert seed["target"] == base["points"][-1]["val_loss"]
        assert all(2.0 < p["train_loss"] < 6.0 for p in base["points"])  # the mean training loss beside each
        assert base["data"]["passes"] == pytest.approx(spec.steps / base["data"]["batches_per_pass"])
        # hybrid predicted, so it skipped backward passes, and its segments were recorded
        assert hyb["backward_skipped_pct"] > 0 and hyb["segments_started"] == len(hyb["segments"]) > 0
        last = hyb["points"][-1]
        assert last["backward"] < last["step"]
        assert spec.steps <= hyb["steps"] <= hybrid_steps(spec)
        # the reported ratios are the ones the curves give
        ttt = seed["to_target"]["cpu_s"]
        if ttt["hybrid"] is not None:
            assert ttt["speedup"] == pytest.approx(ttt["baseline"] / ttt["hybrid"])
        else:
            assert ttt["speedup"] is None and hyb["steps"] == hybrid_steps(spec)
        at_steps = next(p["val_loss"] for p in hyb["points"] if p["step"] == spec.steps)
        assert seed["loss_ratio_equal_steps"] == pytest.approx(at_steps / seed["target"])
    table = (out / "table.md").read_text()
    assert "| char_gpt | quick (60 steps) | `t` | 2 |" in table
    assert (out / "char_gpt_quick_t.png").stat().st_size > 10_000


@pytest.mark.slow
def test_without_prediction_hybrid_matches_plain_bitwise_at_equal_steps(tmp_path):
    """Same module, seed and batch order: with prediction off the two runs' losses must be identical, which is
    what makes the harness's comparison a fair one. ``--threads`` sets torch's threads for both runs."""
    try:
        # one seed: two threads on a loaded 2-core machine oversubscribe it (minutes instead of seconds)
        result, _ = _run_quick(tmp_path, "--threads", "2", "--seeds", "1", "hybrid.enable_prediction=false")
    finally:
        torch.set_num_threads(1)  # the suite's setting (conftest)
    assert result["machine"]["torch_threads"] == 2 and len(result["seeds"]) == 1
    for seed in result["seeds"]:
        assert seed["loss_ratio_equal_steps"] == 1.0
        assert seed["to_target"]["backward"]["speedup"] == 1.0
        assert seed["hybrid"]["backward_skipped_pct"] == 0.0


def test_trial_runs_write_outside_the_committed_results():
    """``--quick`` is a trial: its rows go to a folder git ignores, never into a committed table."""
    from benchmarks.harness import RESULTS, results_folder

    quick = results_folder("quick", 1, "cpu")
    assert quick == RESULTS / "quick" and results_folder("quick", None, "cuda") == quick
    assert results_folder("default", None, "cpu") == RESULTS / "cpu"
    assert results_folder("long", 1, "cpu") == RESULTS / "cpu_1thread"
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert f"/{quick.relative_to(ROOT).as_posix()}/" in ignored


@pytest.mark.parametrize(("flag", "value"), [("--seeds", "0"), ("--threads", "0")])
def test_harness_refuses_counts_below_one(flag, value, capsys):
    with pytest.raises(SystemExit):
        main(["--task", "char_gpt", "--quick", flag, value])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_overheads_time_every_component(tmp_path):
    from benchmarks.overheads import COMPONENTS
    from benchmarks.overheads import main as overheads

    overheads(["--sizes", "tiny", "--quick", "--parts", "profile", "overhead", "rules", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "overheads.json").read_text())["sizes"]["tiny"]
    profile = result["profile"]
    assert 1e4 < profile["params"] < 1e5
    assert profile["steps_by_phase"]["predict"] > 0
    for label, component in profile["components"].items():
        assert component["calls"] > 0, label  # the predicting run exercised every component
        assert component["ms_per_call"] > 0 and component["share_of_ordinary_time"] > 0
    assert set(profile["components"]) == set(COMPONENTS)
    assert result["predict_step"]["with_check"] is not None and result["predict_step"]["without_check"] is not None
    assert {mode: len(r) for mode, r in result["ordinary_overhead"]["ratios"].items()} == {
        "tracking": 1,
        "tracking_per_step": 1,
        "tracking_every_4": 1,
        "backed_off": 1,
    }
    overhead = result["ordinary_overhead"]
    assert set(overhead["steady_ratios"]) == set(overhead["ratios"])
    for label, fits in overhead["seconds"].items():  # one steady step is a part of its fit
        assert all(0 < step < fit for step, fit in zip(overhead["steady_step_seconds"][label], fits, strict=True))
    rules = result["rule_overhead"]  # past the warmup: outer_norm jumps, every backward kept
    assert {mode: len(r) for mode, r in rules["ratios"].items()} == {"outer_norm": 1, "outer_aside": 1}
    assert rules["kept"]["outer_norm"][0]["jumps"] > 0
    aside = rules["kept"]["outer_aside"][0]
    assert aside["jumps"] == 0 and aside["blind"] > 0
    text = (tmp_path / "overheads.md").read_text()
    assert all(label in text for label in COMPONENTS)
    aside = "the default (`outer` with its guards) stepping aside (no cycle judged, no jump)"
    assert f"{aside} / plain over 60 steps" in text


@pytest.mark.slow
def test_quick_overheads_measure_peak_memory_in_parameter_copies(tmp_path):
    """Each run in a process of its own, so that its peak is its own (a part apart, so xdist runs it beside the
    others)."""
    from benchmarks.overheads import main as overheads

    overheads(["--sizes", "tiny", "--quick", "--parts", "memory", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "overheads.json").read_text())["sizes"]["tiny"]
    memory = result["memory"]
    runs = memory["runs"]
    assert runs["linear_predicting"]["predicted_steps"] > 0 and "predicted_steps" not in runs["plain"]
    assert runs["outer"]["predicted_steps"] == 0  # the default predicts no step: it jumps
    assert len({run["param_bytes"] for run in runs.values()}) == 1
    assert 4 * 1e4 < next(iter(runs.values()))["param_bytes"] < 4 * 1e5
    labels = {"linear_predicting", "outer"}  # --quick: one run of each kind
    assert set(memory["in_parameter_copies"]) == labels
    text = (tmp_path / "overheads.md").read_text()
    assert all(f"Peak memory, `{label}` minus plain" in text for label in labels)


def test_gpt2_sized_task_has_gpt2_small_shape(tmp_path):
    from hydra.utils import instantiate

    from benchmarks.tasks import compose_run

    cfg = compose_run("char_gpt_gpt2", "default", 0, [], str(tmp_path))
    model = instantiate(cfg.model)
    shape = {key: model.hparams[key] for key in ("n_layer", "n_embd", "n_head", "block_size")}
    assert shape == {"n_layer": 12, "n_embd": 768, "n_head": 12, "block_size": 256}
    assert model.hparams.max_steps == 300  # the LR schedule spans the baseline's steps
    assert 85e6 < sum(p.numel() for p in model.parameters()) < 86e6


@pytest.mark.parametrize(
    ("task", "schedule", "layers", "width", "params"),
    [("char_gpt_wsd", "wsd", 2, 128, (0.4e6, 0.5e6)), ("char_gpt_mid", "cosine", 4, 256, (3.2e6, 3.4e6))],
)
def test_the_extrapolation_tasks_compose(tmp_path, task, schedule, layers, width, params):
    from hydra.utils import instantiate

    from benchmarks.tasks import compose_run

    model = instantiate(compose_run(task, "default", 0, [], str(tmp_path)).model)
    assert (model.hparams.schedule, model.hparams.n_layer, model.hparams.n_embd) == (schedule, layers, width)
    assert params[0] < sum(p.numel() for p in model.parameters()) < params[1]


def test_warmup_stable_decay_holds_the_peak_then_decays_over_the_last_fifth():
    from lightning_hybrid.demos.char_gpt import CharGPT
    from lightning_hybrid.demos.gpt import lr_factor

    factors = [lr_factor("wsd", 50, 1000, 0.2, step) for step in range(1000)]
    assert factors[49] == 1.0 and set(factors[50:800]) == {1.0}
    assert all(a > b for a, b in pairwise(factors[800:])) and factors[-1] == pytest.approx(0.1, abs=0.01)
    cosine = [lr_factor("cosine", 50, 1000, 0.2, step) for step in range(1000)]
    assert cosine[50] == 1.0 and cosine[-1] == pytest.approx(0.1, abs=1e-4)
    with pytest.raises(ValueError, match="`schedule` must be one of 'constant', 'cosine', 'wsd', got 'linear'"):
        CharGPT(schedule="linear")


def test_the_gpu_step_clock_synchronises_twice_a_run_not_every_step(monkeypatch):
    """On a GPU the steady step is a window's mean, synchronised at its two ends only: a synchronisation every step
    would serialise the host and the device, and add the plugin's host time to the step instead of overlapping it."""
    from benchmarks import harness

    syncs, now = [], iter(float(t) for t in range(100))
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda: syncs.append(True))
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(now) * 0.5)
    clock = harness.StepClock(meter=None, cuda=True)
    for _ in range(harness.SETTLE + 10):
        clock.on_train_batch_end()
    clock.on_train_end()
    assert len(syncs) == 2
    assert clock.steady_step() == 0.5 / 10  # two readings, 0.5 s apart, around the 10 steps after settling


def test_own_time_counts_the_plugins_functions_and_not_lightnings_inside_them(monkeypatch):
    """A plugin function that calls back into Lightning: only its own part is the plugin's time. The clock is the
    test's own, advanced by each function, so what is counted does not move with the machine."""
    from benchmarks import host_work

    clock = [0]
    monkeypatch.setattr(host_work.time, "perf_counter_ns", lambda: clock[0])

    def spend(ns: int) -> None:
        clock[0] += ns

    class Lightning:
        def step(self) -> None:
            spend(30)

    class Plugin:
        def hook(self, lightning: Lightning) -> None:
            spend(10)
            lightning.step()
            spend(5)

    original = Plugin.hook
    with host_work.OwnTime(plugin={Plugin: ("hook",)}, lightning={Lightning: ("step",)}) as own:
        Plugin().hook(Lightning())
        Lightning().step()  # outside the plugin: not counted
        spend(100)  # between bracketed functions: nobody's
    assert own.plugin_ns == 15 and Plugin.hook is original  # restored


@pytest.mark.slow
def test_the_host_work_benchmark_reports_every_mode_against_plain_and_a_profile(tmp_path, monkeypatch):
    from benchmarks import host_work

    # every mode on cycles of 5 steps after 5 (the defaults': 20 after 100): 25 steps hold four cycle ends, and jumps
    short = {mode: {**settings, "warmup_steps": 5, "full_steps": 5} for mode, settings in host_work.MODES.items()}
    monkeypatch.setattr(host_work, "MODES", short)
    host_work.main(["--steps", "25", "--rounds", "1", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "host_work.json").read_text())
    assert set(result["above_plain_us"]) == set(host_work.MODES)
    assert len(result["plain_step_us"]["rounds"]) == len(short)  # a plain run beside each mode
    assert all(len(part["rounds"]) == 1 for parts in result["above_plain_us"].values() for part in parts.values())
    assert result["profile"] and all(row["calls"] > 0 for row in result["profile"])
    assert set(result["counts"]) == set(host_work.MODES)
    assert all(c["python_calls"] > 0 and c["tensor_ops"] > 0 for c in result["counts"].values())  # the plugin's own
    assert all(c["call_depth"] >= 2 for c in result["counts"].values())  # a hook of the scheduler's, and below
    # measured, each run: how it compares with a plain step is the benchmark's figure, not the test's (a wall clock
    # inside the plugin against a plain step's CPU time would flip under load)
    assert all(len(c["own_us"]["runs"]) == 3 and c["own_us"]["min"] > 0 for c in result["counts"].values())
    assert "| default_jumping |" in (tmp_path / "README.md").read_text()


def test_the_muon_task_counts_its_steps_in_batches(tmp_path):
    """Two optimizers step each batch, and Lightning counts a global step for each: the task's steps, its schedule
    and the curve's points count batches, the Trainer's ``max_steps`` twice as many."""
    from benchmarks.harness import fit
    from benchmarks.tasks import Length, compose_run

    tiny = ["model.n_layer=1", "model.n_embd=32", "data.max_bytes=20000"]
    cfg = compose_run("char_gpt_muon", Length(6, 3, 2), 0, tiny, str(tmp_path))
    assert cfg.trainer.max_steps == 12 and cfg.model.max_steps == 6
    record = fit(cfg, hybrid=False)
    assert record.steps == 6 and [p.step for p in record.curve.points] == [3, 6]
    assert [p.backward for p in record.curve.points] == [3, 6]


def test_the_gpa_cost_driver_counts_the_fused_kernel_at_the_floor(fused_device):
    """``python -m benchmarks.gpa_cost --fused`` on a tiny char GPT: one launch, no host read, 6 copies and the
    kernel's small tables."""
    from benchmarks import gpa_cost

    result = gpa_cost.count_fused(shape=(1, 32, 2))
    assert result["step"]["ops"] == result["training_point"]["ops"] == 1 and result["step"]["host_reads"] == 0
    assert 6 < result["step"]["parameter_copies"] < 6.1 and 3 < result["training_point"]["parameter_copies"] < 3.1


def test_the_gpa_cost_driver_counts_times_and_estimates_on_a_tiny_model():
    """``python -m benchmarks.gpa_cost`` on a char GPT of a few thousand parameters (its figures mean nothing)."""
    from benchmarks import gpa_cost

    result = gpa_cost.measure(repeats=2, shape=(1, 32, 2), cpu_sizes={"tiny": (1, 32, 2)})
    assert (result["ops"], result["foreach_ops"], result["host_reads"]) == (8, 7, 0)
    assert round(result["parameter_copies"], 2) == 19  # the seven operations' parameter lists, and a few scalars
    assert result["on_the_cpu"]["tiny"]["averaging_over_step"]["median"] > 0
    text, (low, _) = gpa_cost.to_markdown(result), result["share_of_plain_step_85m"]
    assert "of a plain training step's CPU time" in text
    floor = result["state_bytes"] * 3 / gpa_cost.H200_BANDWIDTH / gpa_cost.PLAIN_STEP_85M[1]  # p, z, x: read, write
    assert "The floor, for any implementation that keeps z and x in the parameters' precision" in text
    assert f"{floor:.1%}-" in text and abs(floor - low * gpa_cost.FLOOR / result["parameter_copies"]) < 1e-12
