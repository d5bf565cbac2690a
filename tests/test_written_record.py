"""The record's tables and counts are the result files' (``python -m benchmarks.record``), none written by hand: the
README's results and every table and count of the performance record lie in regions its generators write, and the
regions are what the files give now."""

import json
import re
import shlex

import pytest

from benchmarks.record import DOCUMENTS, GENERATORS, REGION, stale, written

README, PERFORMANCE = DOCUMENTS[:2]
FOOTPRINT = next(p for p in DOCUMENTS if p.parent.name == "footprint")
COUNT = re.compile(r"\b\d+ of \d+\b")  # "3 of 5 seeds": a count that goes stale when written by hand


def _outside_regions(text: str) -> str:
    return REGION.sub("", text)


def test_every_region_is_what_the_result_files_give():
    assert stale() == [], "run `python -m benchmarks.record` and commit what it wrote"


def test_no_table_or_count_of_the_record_is_written_by_hand():
    prose = _outside_regions(PERFORMANCE.read_text())
    assert not [line for line in prose.splitlines() if line.startswith("|")]
    assert not COUNT.findall(prose)


def test_the_records_stay_within_their_size():
    """A record nobody reads in full records nothing: the performance record within 300 lines, the CHANGELOG 150."""
    changelog = PERFORMANCE.parents[1] / "CHANGELOG.md"
    assert len(PERFORMANCE.read_text().splitlines()) <= 300
    assert len(changelog.read_text().splitlines()) <= 150


def test_the_readmes_results_and_status_are_written_from_the_files():
    readme = README.read_text()
    results = readme.split("## What to expect at your scale", 1)[1].split("\n## ", 1)[0]
    assert "<!-- record: scale-verdict -->" in results and not COUNT.findall(_outside_regions(results))
    assert not [line for line in _outside_regions(results).splitlines() if line.startswith("|")]
    status = readme.split("## Quick start", 1)[0]  # the opening and the status
    for region in ("readme-opening", "scale-status", "gpu-status"):
        assert f"<!-- record: {region} -->" in status
    assert not re.findall(r"\d", _outside_regions(status).split("Three modes:")[0])  # no figure by hand
    assert not COUNT.findall(_outside_regions(readme))  # Lightning's tests too


def test_a_region_is_rewritten_and_one_naming_no_generator_is_refused():
    text = "before\n<!-- record: lightning-tests -->\nstale\n<!-- /record -->\nafter\n"
    again = written(text, {})
    assert again.startswith("before\n<!-- record: lightning-tests -->\nOf ") and again.endswith(
        "<!-- /record -->\nafter\n"
    )
    assert written(again, {}) == again and set(GENERATORS) >= {"scale-table", "scale-status", "lrs-default"}
    with pytest.raises(KeyError, match="names no generator: 'made-up'"):
        written("<!-- record: made-up -->\n<!-- /record -->\n", {})


def test_the_verdict_sets_each_rules_median_against_the_nudged_controls_range(monkeypatch):
    from benchmarks import record, scale

    def seeds(backward: list[float], loss: list[float]) -> list[dict]:
        return [{"backward": b, "loss": v, "overfit": False} for b, v in zip(backward, loss)]

    figures = {  # the first cell: a gain beyond chaos; the second: inside it in steps, and a worse loss
        "0.47M_25tpp": {
            "default": seeds([1.1, 1.2, 1.05], [0.99, 0.98, 0.99]),
            "nudged": seeds([0.9, 1.0, 1.04], [1.0] * 3),
        },
        "1.2M_1.5tpp": {
            "default": seeds([1.0, 1.1, 0.9], [1.02, 1.03, 1.01]),
            "nudged": seeds([0.8, 1.2, 1.0], [0.99] * 3),
            "gpa": seeds([None, None, 1.3], [1.0] * 3),  # two seeds never at plain's final loss: the slowest
        },
    }
    monkeypatch.setattr(scale, "cell_figures", lambda cell: figures.get(cell.name))
    text = record.scale_verdict()
    cells = "0.47M_1.5tpp | 0.47M_6tpp | 0.47M_25tpp | 1.2M_1.5tpp | 3.3M_1.5tpp"
    assert text.startswith(
        f"| each rule's median against plain nudged's range | {cells} |\n|---|---|---|---|---|---|\n"
    )
    assert "| `default`, backward passes to plain's final loss | - | - | better | inside | - |" in text
    assert "| `default`, loss at equal steps | - | - | better | worse | - |" in text
    assert "| `gpa`, backward passes to plain's final loss | - | - | - | worse | - |" in text  # no block of it at 25
    assert "gpa_scaled" not in text  # no block of it anywhere: no row
    assert record.scale_lost() == (
        "- `default` at 1.2M_1.5tpp, loss at equal steps: 1.020 (1.010-1.030); plain nudged 0.990 (0.990-0.990).\n"
        "- `gpa` at 1.2M_1.5tpp, backward passes to plain's final loss: not reached in 2 of 3; plain nudged 1.00x "
        "(0.80-1.20).\n"
        "- `gpa` at 1.2M_1.5tpp, loss at equal steps: 1.000 (1.000-1.000); plain nudged 0.990 (0.990-0.990).\n"
    )


def test_the_gpu_status_names_where_plain_was_lowest_when_not_at_its_end(tmp_path, monkeypatch):
    """A plain curve lowest before its end is said so, with its step, and the best rate passes it by."""
    import json
    import shutil

    from benchmarks import record

    for name in ("quality", "profile", "overheads"):
        shutil.copy(record.GPU_RUN / f"{name}.json", tmp_path)
    quality = json.loads((tmp_path / "quality.json").read_text())
    slow = quality["runs"]["lr0.0003_seed0_plain"]["points"]
    slow[5]["val_loss"] = 0.5  # lowest at its sixth validation, then up: memorising
    (tmp_path / "quality.json").write_text(json.dumps(quality))
    assert "plain lowest at its last step at every swept rate" in record.gpu_status()
    monkeypatch.setattr(record, "GPU_RUN", tmp_path)
    said = " ".join(record.gpu_status().split())
    assert f"plain lowest at steps {slow[5]['step']}, 1000, 1000 at the swept rates" in said
    assert "best rate (0.0006)" in said


# each term the README's opening and status use, and the words that define it where it is first used
DEFINED = {
    "the default": "the default rule (`outer`, below)",
    "tokens a parameter": "tokens a parameter (training tokens over parameters)",
    "plain nudged": "plain nudged's range (plain with its learning rate 1.001x",
    "loss at equal steps": "the loss at equal steps is the default's over plain's at plain's last step",
    "backward passes and CPU time to plain's final validation loss": (
        "backward passes and CPU time to plain's final validation loss are plain's over the default's"
    ),
}


def test_the_readme_opens_with_what_to_expect_and_defines_each_term_where_first_used():
    """A user reads the first screen as sentences: what the default gave where it was measured, what to expect at
    100M trained to the end and from where, what it costs and how to check it on one's own module; every term of the
    figures defined at its first use (plain nudged was once used two lines before anything said what it is)."""
    readme = " ".join(README.read_text().split())  # the words, whatever the line breaks
    opening = readme[: readme.index("Three modes:")]
    for said in ("What to expect.", "On a CPU", "H200", "trained to the end", "It costs", "mode=compare"):
        assert said in opening, said
    for term, definition in DEFINED.items():
        first = readme.lower().index(term.lower())
        assert first == readme.lower().index(definition.lower()) + definition.lower().index(term.lower()), term
    assert readme.index("**The figures.**") < readme.index("## Quick start")


def test_the_times_and_sizes_the_readme_quotes_are_the_footprints_files():
    """The footprint's times live in times.json and its sizes in checkpoint_size.json; the README quotes only them."""
    from benchmarks import footprint

    readme, folder = README.read_text(), FOOTPRINT.parent
    runs = footprint.times().values()
    measured = {footprint.duration(run[k]) for run in runs for k in ("wall_s", "pytest_s") if k in run}
    assert set(re.findall(r"\b\d+ min \d+ s\b", readme)) <= measured
    sizes = json.loads((folder / "checkpoint_size.json").read_text())["megabytes"]
    pending = next(mb for name, mb in sizes.items() if name.startswith("hybrid, a jump pending"))
    assert f"{pending:.1f} MB against plain's {sizes['plain, after fit']:.1f}" in readme


def test_the_readmes_memory_figures_are_their_files():
    """The README's prose outside the regions quotes two measured figures besides the footprint's: the state held on
    the host (copies above plain on an H100) and the default's copies on the device, each from its file."""
    from benchmarks.harness import RESULTS

    run = json.loads((RESULTS / "gpu" / "2026-11-26-h100-2" / "mechanics.json").read_text())["outer_memory"]
    readme = README.read_text()
    on_host = run["state_on_host"]["copies_above_plain"]
    assert f"({on_host:.2f} copies on the device:\n  `gpu/2026-11-26-h100-2`)" in readme
    assert round(run["outer_norm_restart"]["copies_above_plain"]) == 3 and "(3 parameter copies on an H100's" in readme


def test_the_records_prose_on_the_gpu_runs_data_is_its_files():
    """The performance record's prose on the 85M run's data: its tokens and the share of a pass, from every run."""
    from benchmarks.harness import RESULTS

    runs = json.loads((RESULTS / "gpu" / "2026-11-28" / "quality.json").read_text())["runs"].values()
    data = {(r["data"]["train_tokens"], round(r["data"]["passes"], 2)) for r in runs}
    assert len(data) == 1, data  # every run read the same text, as far
    tokens, passes = data.pop()
    prose = " ".join(PERFORMANCE.read_text().split())
    assert f"on {tokens / 1e6:.1f}M tokens of text, {passes:.2f} of a pass" in prose


def test_a_timed_command_is_kept_with_where_and_when_it_ran(tmp_path):
    from benchmarks import footprint

    kept = tmp_path / "times.json"
    burn = "import time\nwhile time.process_time() < 0.3: pass"  # 0.3 CPU seconds on any machine, one thread
    result = footprint.measure("suite", ["python", "-c", burn], path=kept)
    # the child's CPU time is counted (at least what it burnt), and one thread's CPU time is within its wall time
    assert result["returncode"] == 0 and result["wall_s"] >= result["cpu_s"] >= 0.3
    assert json.loads(kept.read_text())["suite"]["command"] == shlex.join(["python", "-c", burn])
    assert "pytest_s" not in result  # no pytest ran
    closing = "print('=== 745 passed, 6 skipped, 490 warnings in 291.91s (0:04:51) ===')"
    assert footprint.measure("suite", ["python", "-c", closing], path=kept)["pytest_s"] == 291.91
    failed = footprint.measure("quick_start", ["python", "-c", "raise SystemExit(3)"], path=kept)
    assert failed["returncode"] == 3 and "quick_start" not in json.loads(kept.read_text())  # only what succeeded
    with pytest.raises(SystemExit, match="name='made-up' is not one of"):
        footprint.measure("made-up", ["true"], path=kept)
    assert footprint.duration(47) == "47 s" and footprint.duration(294.5) == "4 min 54 s"


def test_the_prose_on_warm_up_and_on_the_capture_buffer_is_its_files():
    """How it works quotes what jumping through a learning-rate warm-up cost (each seed's backward passes to plain's
    loss against waiting) and the peak RSS of the per-step capture at batch 8 and 32: each from its file."""
    from benchmarks.harness import RESULTS

    def backward(kind: str) -> list[float]:
        runs = json.loads((RESULTS / "lr_warmup" / f"char_gpt_1000steps_warmup250_{kind}.json").read_text())
        return [seed["to_target"]["backward"]["hybrid"] for seed in runs["seeds"]]

    cost = [100 * (jumped / waited - 1) for jumped, waited in zip(backward("default"), backward("waits"), strict=True)]
    prose = " ".join((README.parent / "docs" / "how-it-works.md").read_text().split())
    assert f"{min(cost):.1f}-{max(cost):.1f}% of its backward passes to plain's loss against waiting" in prose
    record = " ".join((RESULTS / "lr_warmup" / "README.md").read_text().split())
    assert "by {:.1f}%, {:.1f}% and {:.1f}% of backward passes".format(*cost) in record  # each seed's, same file
    copies = []
    for folder, size in (("cpu_1thread", "25M"), ("overheads_batch32", "25M_batch32")):
        memory = json.loads((RESULTS / folder / "overheads.json").read_text())["sizes"][size]["memory"]
        for mode in ("linear_tracking_per_step", "linear_predicting_per_step"):
            copies.append(memory["in_parameter_copies"][mode]["peak_rss_growth_bytes"])
    said = "{:.2f} and {:.2f} copies above plain at batch 8, {:.2f} and {:.2f} at batch 32".format(*copies)
    assert said in prose


def test_the_fault_table_is_the_same_however_the_workers_shared_the_cases(tmp_path):
    """The reliability table from a run's JUnit XML: the default's rows first, then by test, in any order of cases;
    written between the page's markers, each case's row once (each case checks its own row there as it runs)."""
    from tests.faults.table import rows_on_page, table, write

    def case(name: str, mode: str | None) -> str:
        props = {"fault": f"fault of {name}", "where": "full step", "outcome": "kept"} | (
            {"mode": mode} if mode else {}
        )
        listed = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
        return (
            f'<testcase classname="tests.faults.test_faults" name="{name}"><properties>{listed}</properties></testcase>'
        )

    cases = [case("test_b", None), case("test_c", "default"), case("test_a", None), case("test_d", "default")]
    tables = []
    for order in (cases, cases[::-1]):
        (tmp_path / "faults.xml").write_text(f"<testsuites><testsuite>{''.join(order)}</testsuite></testsuites>")
        tables.append(table(str(tmp_path / "faults.xml")))
    rows = tables[0].splitlines()[2:]
    assert tables[0] == tables[1]
    assert [row.split(" | ")[1] for row in rows] == [f"fault of test_{n}" for n in "cdab"]
    assert [row.split(" | ")[0] for row in rows] == ["| default"] * 2 + ["| per-step"] * 2
    page = tmp_path / "reliability.md"
    page.write_text("before\n<!-- fault-suite: table -->\nstale\n<!-- /fault-suite -->\nafter\n")
    write(str(tmp_path / "faults.xml"), page)
    assert rows_on_page(page) == rows and page.read_text().startswith("before\n") and "stale" not in page.read_text()
    on_the_page = [row.split(" | ")[:3] for row in rows_on_page()]
    assert on_the_page and len(on_the_page) == len({tuple(r) for r in on_the_page})
