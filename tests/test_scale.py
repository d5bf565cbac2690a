"""``benchmarks.scale`` on a char GPT of a few thousand parameters (its figures mean nothing here): a cell's sweep
finds the best rate inside its rates, each seed's block runs plain, the default and nudged plain in one process (seed
0's plain is the sweep's run, made by the same process), a finished grid runs nothing again, a block another process
left unfinished runs again whole, and the report's table and plots come from the files."""

import json
from dataclasses import replace

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def scale(tmp_path, monkeypatch):
    from benchmarks import scale
    from benchmarks.tasks import TASKS

    monkeypatch.setattr(scale, "OUT", tmp_path)
    # the char GPT's 1 MB corpus (these runs read no more) in batches of 8 windows, not 32: a third less time a run
    monkeypatch.setitem(TASKS, "char_gpt_batch8", replace(TASKS["char_gpt"], overrides=("data.batch_size=8",)))
    monkeypatch.setattr(scale, "TASK", "char_gpt_batch8")
    monkeypatch.setattr(scale, "SIZES", {"tiny": (1, 32, 2)})
    monkeypatch.setattr(scale, "CENTRE", {"tiny": 0.048})  # the best of three here (final losses 2.760, 2.705, 2.751)
    monkeypatch.setattr(scale, "GRIDS", {"length": [("tiny", 3.0)], "size": [("tiny", 3.0)]})
    monkeypatch.setattr(scale, "SEEDS", 1)
    monkeypatch.setattr(scale, "VALIDATIONS", 4)  # 44 steps: at 20 validations (40 steps) they took 3/4 of a run
    return scale


def test_a_cell_sweeps_then_pairs_each_seeds_runs_in_one_process_and_resumes(scale, tmp_path, monkeypatch):
    cell, fits, fit = scale.Cell("tiny", 3.0), [], scale.fit
    monkeypatch.setattr(scale, "fit", lambda *args, **kwargs: fits.append(kwargs["hybrid"]) or fit(*args, **kwargs))
    scale.run("length", seeds=(0,))
    sweep_file = tmp_path / cell.name / "sweep.json"
    sweep = json.loads(sweep_file.read_text())["runs"]
    block = json.loads(scale.block_path(cell, 0).read_text())
    assert sorted(map(float, sweep)) == [0.024, 0.048, 0.096] and block["lr"] == 0.048
    assert set(block["runs"]) == {"plain", "default", "nudged"} and block["process"] == scale.PROCESS
    assert block["runs"]["plain"] == sweep["0.048"] and len(fits) == 5  # seed 0's plain: the sweep's run
    assert [block["runs"][c]["trained_lr"] for c in ("default", "nudged")] == [0.048, 0.048 * 1.001]
    assert all(r["process"] == scale.PROCESS and r["data"]["passes"] < 1 for r in block["runs"].values())
    assert {r["val_batches"] for r in block["runs"].values()} == {cell.length.val_batches}
    scale.run("length", seeds=(0,))
    assert len(fits) == 5  # a finished grid trains nothing
    scale.block_path(cell, 0).unlink()
    scale.run("length", seeds=(0,), only=("0.47M_25tpp",))
    assert len(fits) == 5 and not scale.block_path(cell, 0).exists()  # a cell not named is left alone
    scale.block_path(cell, 0).write_text(json.dumps(block))

    elsewhere = {**scale.PROCESS, "pid": -1}  # another process made the sweep and stopped after the block's plain
    swept = json.loads(sweep_file.read_text())
    swept["runs"] = {lr: {**run, "process": elsewhere} for lr, run in swept["runs"].items()}
    sweep_file.write_text(json.dumps(swept))
    left = {**block, "process": elsewhere, "runs": {"plain": swept["runs"]["0.048"]}}
    scale.block_path(cell, 0).write_text(json.dumps(left))
    scale.run("length", seeds=(0,))
    again = json.loads(scale.block_path(cell, 0).read_text())
    assert fits[5:] == [False, True, False]  # plain again, then the default and the control, in this process
    assert again["process"] == scale.PROCESS and again["runs"]["plain"]["process"] == scale.PROCESS

    scale.run("length", seeds=(0,), name="gpa")  # primal averaging, in a block of its own beside a plain run again
    gpa = json.loads(scale.block_path(cell, 0, ("gpa",)).read_text())
    assert set(gpa["runs"]) == {"plain", "gpa"} and fits[-2:] == [False, True]
    assert gpa["runs"]["gpa"]["trained_lr"] == 0.048 and gpa["process"] == scale.PROCESS

    text = scale.report()
    row = next(line for line in text.splitlines() if line.startswith(f"| {cell.name} "))
    assert row.startswith(f"| {cell.name} | 0.03M | 3 | {cell.length.steps} | 0.048 | 1 |")
    assert row.split("|")[8].strip() not in ("-", "")  # the backward passes of gpa
    assert (tmp_path / "README.md").read_text() == text
    assert f"- {cell.name} ({cell.length.steps} steps, validated on {cell.length.val_batches} batches): " in text
    assert (tmp_path / "gain_by_length.png").stat().st_size > 10_000 and (tmp_path / "gain_by_size.png").exists()


def test_scaled_primal_averaging_keeps_the_published_window_where_it_was_measured_and_scales_it_with_the_run():
    from benchmarks import scale
    from lightning_hybrid.predictors.gpa import PrimalAveraging

    def window(cell: scale.Cell) -> float:
        overrides, _ = scale.overrides_of(cell, "gpa_scaled")
        mu_x = float(overrides[-1].removeprefix("predictor.mu_x="))
        assert overrides[0] == "predictor=gpa" and PrimalAveraging(mu_x=mu_x).mu_x == mu_x
        return 1 / (1 - mu_x)

    longest, shorter = scale.Cell("0.47M", 25.0), scale.Cell("0.47M", 6.0)
    assert window(longest) == pytest.approx(1 / (1 - 0.9967), rel=1e-3)
    assert window(shorter) / window(longest) == pytest.approx(shorter.length.steps / longest.length.steps, rel=1e-3)
    assert scale.overrides_of(longest, "gpa") == (["predictor=gpa"], 1.0)


def test_the_command_runs_the_seeds_it_names_and_refuses_one_outside_the_grid(monkeypatch, capsys):
    """Two processes share a cell by naming different seeds: each runs only its own blocks."""
    from benchmarks import scale

    ran = []
    monkeypatch.setattr(scale, "run", lambda grid, seeds, name, only: ran.append((grid, seeds, name, only)))
    monkeypatch.setattr(scale.torch, "set_num_threads", lambda n: None)  # this worker's other tests keep theirs
    scale.main(["run", "size", "--cells", "3.3M_1.5tpp", "--seeds", "2", "--block", "gpa"])
    scale.main(["run", "length"])
    assert ran == [("size", (2,), "gpa", ("3.3M_1.5tpp",)), ("length", (0, 1, 2), "default", None)]
    with pytest.raises(SystemExit):
        scale.main(["run", "size", "--seeds", "3"])
    assert "--seeds: invalid choice: 3" in capsys.readouterr().err


def test_the_plots_follow_the_tables_rule_and_draw_misses_as_misses():
    """From the committed result files: each plotted median is the table's (a seed that never reached plain's loss
    counts as the slowest), misses are counted where they are drawn, the axes read as plain numbers, and a third
    panel gives the loss at equal steps, nudged plain beside. Once the plots dropped the misses: ``gpa_scaled`` at
    0.47M and 1.5 tokens a parameter was drawn at 0.74 where the table says 0.67x."""
    import matplotlib.pyplot as plt

    from benchmarks import scale
    from benchmarks.report import median_over_seeds

    for grid in scale.GRIDS:
        grid_cells = [scale.Cell(*c) for c in scale.GRIDS[grid]]
        cells = {c.tokens_per_param if grid == "length" else c.params / 1e6: c for c in grid_cells}
        for config in scale.STYLES:
            for panel in scale.PANELS:
                points = scale.plot_points(grid, panel, config)
                ran = [x for x, cell in cells.items() if scale.cell_figures(cell).get(config)]
                assert [p.x for p in points] == ran, (grid, config)
                for point in points:
                    values = [s[panel] for s in scale.cell_figures(cells[point.x])[config]]
                    assert point.median == median_over_seeds(values) and point.seeds == len(values)
                    assert point.missed == values.count(None)
    scaled = scale.plot_points("length", "backward", "gpa_scaled")[0]
    assert round(scaled.median, 2) == 0.67 and (scaled.missed, scaled.seeds) == (1, 3)  # the table's 0.67x
    gpa = {p.x: p for p in scale.plot_points("length", "backward", "gpa")}
    assert gpa[6.0].median is None and gpa[6.0].missed == 2  # not reached in 2 of 3: drawn as a miss, not a point
    fig = scale.figure("length")
    backward, _, loss = fig.axes[:3]
    assert [t.get_text() for t in backward.get_xticklabels()] == ["1.5", "6", "25"]
    assert loss.get_title().startswith("loss at plain's last step") and "nudged" in loss.get_legend_handles_labels()[1]
    plt.close(fig)


def test_each_size_is_named_by_its_counted_parameters():
    """A size's name is its model's count, to two figures, in the scale grid and the averaging cost's file alike."""
    from benchmarks import scale as grid
    from benchmarks.harness import RESULTS

    for name, dims in grid.SIZES.items():
        assert f"{grid.parameters(*dims) / 1e6:.2g}M" == name
    on_the_cpu = json.loads((RESULTS / "gpa_cost" / "gpa_cost.json").read_text())["on_the_cpu"]
    assert on_the_cpu and all(f"{cell['parameters'] / 1e6:.2g}M" == name for name, cell in on_the_cpu.items())
