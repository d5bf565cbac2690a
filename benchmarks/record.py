"""The record's tables and counts, written from the result files (and the settings reference's tables, from the
settings' declarations: ``settings_reference``): every region of the documents below between
``<!-- record: NAME -->`` and ``<!-- /record -->`` is the output of NAME's generator; the prose around the regions is
the authors'. A test checks that every table of the performance record lies in a region and that the regions are
what the files give.

    python -m benchmarks.record           # rewrite the regions
    python -m benchmarks.record --check   # list the regions that differ from what the result files give
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import footprint, gpu, lrs, scale, settings_reference
from benchmarks.report import median_over_seeds, seeds_cell

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (
    ROOT / "README.md",
    ROOT / "docs" / "performance.md",
    ROOT / "docs" / "how-it-works.md",
    ROOT / "benchmarks" / "results" / "footprint" / "README.md",
    ROOT / "benchmarks" / "results" / "lightning_tests" / "README.md",
    ROOT / "docs" / "settings.md",
)
REGION = re.compile(r"(<!-- record: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /record -->)", re.S)
DEFAULT = "outer_norm_restart_res"  # the default's configuration name in the learning-rate grid's files


# -- the paired scale grid (benchmarks/scale.py) -------------------------------------------------------------------
def _median(cell: scale.Cell, key: str, config: str, fmt: str, suffix: str = "") -> str:
    values = [s[key] for s in (scale.cell_figures(cell) or {}).get(config, [])]
    middle = median_over_seeds(values) if values else None
    return "not reached" if middle is None else f"{middle:{fmt}}{suffix}"


def _measured(cells: list[scale.Cell]) -> scale.Cell | None:
    """The last of ``cells`` with the default's seeds in."""
    return next((c for c in cells[::-1] if (scale.cell_figures(c) or {}).get("default")), None)


def _verdict_words(cell: scale.Cell) -> str:
    """What the default's backward passes at ``cell`` say against plain nudged's range."""
    found = _against_floor(cell, "default", "backward")
    side = found[0] if found else SIDES[1]
    return {
        SIDES[0]: "beyond plain nudged's range: a gain chaos alone did not give",
        SIDES[1]: "inside plain nudged's range: no gain measured",
        SIDES[2]: "below plain nudged's range: a loss",
    }[side]


def scale_status() -> str:
    """The README's status in the grid's figures, its terms defined first: medians over seeds (the table gives the
    ranges) at the longest run and the largest model, plain nudged beside each, and what each says."""
    said = []
    sizes = [scale.Cell(size, scale.SHARED_LENGTH) for size in scale.SIZES]
    longest = max((scale.Cell(*c) for c in scale.GRIDS["length"]), key=lambda c: c.tokens_per_param)
    for cell in (longest, _measured(sizes) or sizes[-1]):
        where = f"at {cell.tokens_per_param:g} tokens a parameter ({cell.size}"
        seeds = len((scale.cell_figures(cell) or {}).get("default", []))
        if not seeds:
            said.append(f"{where}), not measured yet")
            continue
        figures = [
            [_median(cell, a, c, ".2f", "x") for a in ("backward", "cpu_s")] + [_median(cell, "loss", c, ".3f")]
            for c in ("default", "nudged")
        ]
        said.append(
            f"{where}, {seeds} seeds), {', '.join(figures[0])} (plain nudged: {', '.join(figures[1])}), "
            f"{_verdict_words(cell)}"
        )
    text = (
        "**The figures.** Plain nudged is plain Lightning with its learning rate 1.001x: what chaos alone changes, the "
        "noise floor each figure stands beside. Backward passes and CPU time to plain's final validation loss are "
        "plain's over the default's (above 1: the default got there sooner); the loss at equal steps is the "
        "default's over plain's at plain's last step (below 1: lower). Medians over seeds on a 2-core CPU: "
        + "; ".join(said)
        + "."
    )
    return textwrap.fill(text, 118) + "\n"


RULES = ("default", "gpa", "gpa_scaled")  # the grid's rules, each judged against plain nudged
SCALE_AXES = {"backward": (1, "backward passes to plain's final loss"), "loss": (-1, "loss at equal steps")}
SIDES = ("better", "inside", "worse")  # than all of plain nudged's range, inside it, worse than all of it


def _scale_cells() -> list[scale.Cell]:
    return sorted(scale.every_cell(), key=lambda c: (c.params, c.tokens_per_param))


def _against_floor(cell: scale.Cell, config: str, key: str) -> tuple[str, list[float], list[float]] | None:
    """Where ``config``'s median of ``key`` lies against plain nudged's range in ``cell`` (one of ``SIDES``), with
    both sets of values (a seed that never reached plain's final loss: ``None``, the slowest; a seed where plain
    overfits: left out); ``None`` where either has none."""
    f = scale.cell_figures(cell) or {}

    def values(of: str) -> list[float | None]:
        return [s[key] for s in f.get(of, []) if not s["overfit"] and (key == "backward" or s[key] is not None)]

    mine, floor = values(config), values("nudged")
    if not mine or not floor:
        return None
    better = SCALE_AXES[key][0]
    middle = (median_over_seeds(mine) or 0.0) * better  # half or more never reached it: slower than any
    low, high = sorted((min(v or 0.0 for v in floor) * better, max(v or 0.0 for v in floor) * better))
    return SIDES[0] if middle > high else SIDES[2] if middle < low else SIDES[1], mine, floor


def scale_verdict() -> str:
    """Where each rule's median lies against plain nudged's range over seeds (the noise floor), cell by cell, as one
    table: above it is a gain chaos alone did not give, inside it is none measured."""
    cells = _scale_cells()
    rows = []
    for config in RULES:
        for key, (_, what) in SCALE_AXES.items():
            found = [_against_floor(cell, config, key) for cell in cells]
            if any(found):
                rows.append(f"| `{config}`, {what} | " + " | ".join(f[0] if f else "-" for f in found) + " |")
    if not rows:
        return "Nothing measured yet.\n"
    head = "| each rule's median against plain nudged's range | " + " | ".join(c.name for c in cells) + " |"
    return "\n".join([head, "|---" * (len(cells) + 1) + "|", *rows]) + "\n"


def scale_lost() -> str:
    """The record's "what lost" from the grid: each cell where a rule's median is worse than all of plain nudged's
    range, with the figures (medians, ranges over seeds)."""
    lines = []
    for config in RULES:
        for cell in _scale_cells():
            for key, (_, what) in SCALE_AXES.items():
                found = _against_floor(cell, config, key)
                if found and found[0] == SIDES[2]:
                    fmt, suffix = (".2f", "x") if key == "backward" else (".3f", "")
                    mine, floor = (seeds_cell(v, fmt, suffix) for v in found[1:])
                    line = f"- `{config}` at {cell.name}, {what}: {mine}; plain nudged {floor}."
                    lines.append(textwrap.fill(line, 118, subsequent_indent="  "))
    return "\n".join(lines or ["- Nothing on the grid yet."]) + "\n"


def scale_table() -> str:
    return scale.cells_table(_scale_cells()) + "\n"


def scale_sweeps() -> str:
    return scale.sweeps() + "\n"


# -- the earlier grid across learning rates (benchmarks/lrs.py): history, each pair labelled -----------------------
def _rows(task: str, lr: float, config: str, best: float) -> list[dict]:
    return lrs.seed_rows(task, lr, config, best)


def _paired(rows: list[dict]) -> str:
    """How many of a cell's seeds met their baseline on another host or more than ``APART_HOURS`` apart."""
    apart = sum(bool(r.get("other_host")) or (r.get("hours_apart") or 0) > lrs.APART_HOURS for r in rows)
    return f"{apart} of {len(rows)}" if apart else "none"


def lrs_default() -> str:
    """Per task and rate, the default's backward passes to plain's final loss beside plain's own controls, and how
    many of its seeds met a plain baseline from another host or session."""
    lines = [
        "| task | rate | default: backward passes | plain nudged | plain run again | default's loss at equal steps"
        " | seeds unpaired (another host, or over 3 h apart) |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in lrs.LR_TASKS:
        best = lrs.tuned(task)
        for name, lr in lrs.grid_rates(best).items():
            rows = _rows(task, lr, DEFAULT, best)
            if not rows:
                continue
            controls = [
                lrs.time_cell(_rows(task, lr, c, best), "backward") if _rows(task, lr, c, best) else "-"
                for c in lrs.CONTROLS
            ]
            loss = seeds_cell([r["loss"] for r in rows], ".3f", "")
            lines.append(
                f"| {task} | {lrs.LABELS[name]} | {lrs.time_cell(rows, 'backward')} | "
                + " | ".join(controls)
                + f" | {loss} | {_paired(rows)} |"
            )
    return "\n".join(lines) + "\n"


def lrs_pairs() -> str:
    """The count behind the history label: the default's seed pairs, and those that met a baseline elsewhere."""
    rows = [
        r
        for task in lrs.LR_TASKS
        for lr in lrs.grid_rates(lrs.tuned(task)).values()
        for r in _rows(task, lr, DEFAULT, lrs.tuned(task))
    ]
    host = sum(bool(r.get("other_host")) for r in rows)
    late = sum((r.get("hours_apart") or 0) > lrs.APART_HOURS for r in rows)
    return (
        f"Of the default's {len(rows)} seed pairs in this grid, {host} met a plain baseline that ran on another host "
        f"and {late} one that ended more than {lrs.APART_HOURS} hours apart.\n"
    )


CONFIG_CELLS = (("char_gpt", "tuned"), ("char_gpt", "3x"), ("char_gpt_mid", "tuned"), ("digits_cnn", "3x"))


def lrs_configs() -> str:
    """Every rule the grid ran (the default, its guards one at a time, and what lost), in four cells: backward
    passes to plain's final loss and the loss at equal steps."""
    heads = [f"{t}, {lrs.LABELS[r]}" for t, r in CONFIG_CELLS]
    lines = ["| configuration | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for config in (*lrs.HYBRID, *lrs.RETIRED):
        cells = []
        for task, rate in CONFIG_CELLS:
            best = lrs.tuned(task)
            rows = _rows(task, lrs.grid_rates(best)[rate], config, best)
            loss = median_over_seeds([r["loss"] for r in rows]) if rows else None
            cells.append(f"{lrs.time_cell(rows, 'backward')}, {loss:.3f}" if loss is not None else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| `{config}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def lrs_peers() -> str:
    """The default against the peers Lightning users reach for, at a third of the tuned rate and at it."""
    configs = (DEFAULT, "ema", "schedulefree")
    lines = ["| task | " + " | ".join(f"`{c}`, tuned/3 and tuned" for c in configs) + " |", "|---|---|---|---|"]
    for task in lrs.LR_TASKS:
        best, cells = lrs.tuned(task), []
        for config in configs:
            said = [
                lrs.time_cell(rows, "backward") if (rows := _rows(task, lr, config, best)) else "-"
                for lr in (best / 3, best)
            ]
            cells.append("; ".join(said))
        if any(c != "-; -" for c in cells[1:]):
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- the GPU run (benchmarks/gpu.py) ----------------------------------------------------------------------------
GPU_RUN = scale.RESULTS / "gpu" / "2026-11-28"  # the run the README speaks of: 85M on one H200


def _gpu(name: str) -> dict:
    return json.loads((GPU_RUN / f"{name}.json").read_text())


def _gpu_arm(row: dict) -> str:
    """An arm's backward passes and wall time to plain's final loss, and its loss at equal steps: medians."""
    backward, wall = (median_over_seeds(row[f"{axis}_speedups"]) for axis in ("backward", "wall_s"))
    loss = f"{median_over_seeds(row['loss_equal_steps']):.3f}"
    if backward is None:
        missing = sum(v is None for v in row["backward_speedups"])
        return f"never reached plain's loss ({missing} of {len(row['backward_speedups'])}), {loss} at equal steps"
    return f"{backward:.2f}x, {wall:.2f}x, {loss}"


def _gpu_order(runs: dict, compared: dict) -> tuple[int, int, int, int]:
    """Of the GPU pairs, how many ran plain first (the file keeps the runs in the order they ran), how many there
    are; of the default's, how many took plain longer for its whole run, of how many."""
    order, first, pairs = list(runs), 0, 0
    for key, row in compared.items():
        lr = float(key.split("_")[0][2:])
        for seed in range(len(row["backward_speedups"])):
            pairs += 1
            first += order.index(gpu._key(lr, seed, "plain")) < order.index(gpu._key(lr, seed, row["arm"]))
    whole = [v for row in compared.values() if row["arm"] == "default" for v in row["whole_run_wall"]]
    return first, pairs, sum(v > 1 for v in whole if v is not None), len(whole)


def gpu_status() -> str:
    """The README's GPU sentences: the default at the sweep's best rate and a third of it, primal averaging at the
    best, and why the wall-time ratio favours the default (the order the pairs ran in)."""
    runs = _gpu("quality")["runs"]
    best = gpu.best_rate(runs)
    compared = gpu.comparisons(runs, best)
    lowest = [row["lowest_step"] for row in gpu.sweep_summary(runs).values()]
    read = runs[gpu._key(best, 0, "plain")]["data"]
    tokens = read["passes"] * read["train_tokens"]  # what a run trained on, none of it twice
    default = [row for row in compared.values() if row["arm"] == "default"]
    gpa = [row for row in compared.values() if row["arm"] == "gpa"]
    first, pairs, longer, whole = _gpu_order(runs, compared)
    curves = (
        "plain lowest at its last step at every swept rate"
        if set(lowest) == {gpu.QUALITY_STEPS}
        else f"plain lowest at steps {', '.join(map(str, lowest))} at the swept rates"
    )
    order = (
        f"plain ran first in {first} of {pairs} pairs and its whole run took longer than the default's in {longer} "
        f"of {whole}, though the default only adds work: the order favoured the default, so read backward passes"
    )
    text = (
        f"On one H200 at 85M parameters ([`gpu/{GPU_RUN.name}`](benchmarks/results/gpu/{GPU_RUN.name}/README.md), "
        f"bf16, {gpu.QUALITY_STEPS:,} steps, {tokens / gpu.PARAMETERS:.1g} tokens a parameter, {gpu.QUALITY_SEEDS} "
        f"seeds, {curves}; no plain nudged ran), backward passes, wall time and loss as above: at the best rate "
        f"({best:.2g}) {_gpu_arm(default[0])}; at a third of it {_gpu_arm(default[1])}; primal averaging "
        f"{_gpu_arm(gpa[0])}. In wall time {order}."
    )
    return textwrap.fill(text, 118) + "\n"


def _large_model(cell: scale.Cell | None) -> str:
    """The opening's sentence on the largest model measured: its figure against plain nudged's range, defined."""
    if cell is None:
        return "Larger models are not measured yet."
    found = _against_floor(cell, "default", "backward")
    floor = [v for v in found[2] if v is not None] if found else []
    spread = f", {min(floor):.2f}-{max(floor):.2f}x" if floor else ""
    verdict = {SIDES[0]: "beyond", SIDES[1]: "inside", SIDES[2]: "below"}[found[0] if found else SIDES[1]]
    gain = {"beyond": "a gain chaos alone did not give", "inside": "no gain is measured there", "below": "a loss"}
    return (
        f"At {cell.size} ({cell.tokens_per_param:g} tokens a parameter) its "
        f"{_median(cell, 'backward', 'default', '.2f', 'x')} lies {verdict} plain nudged's range (plain with its "
        f"learning rate 1.001x, what chaos alone gives{spread}): {gain[verdict]}."
    )


def readme_opening() -> str:
    """The README's first lines, for a user deciding whether to try the plugin: what the default gave where it was
    measured (size, run length, machine), what to expect where it was not, what it costs, and how to check it on
    one's own module; every figure from its file, every term defined where first used."""
    longest = max((scale.Cell(*c) for c in scale.GRIDS["length"]), key=lambda c: c.tokens_per_param)
    runs = _gpu("quality")["runs"]
    best = gpu.best_rate(runs)
    at_best = next(row for row in gpu.comparisons(runs, best).values() if row["arm"] == "default")
    read = runs[gpu._key(best, 0, "plain")]["data"]
    tokens_gpu = read["passes"] * read["train_tokens"] / gpu.PARAMETERS
    copies = median_over_seeds([b / (4 * gpu.PARAMETERS) for b in at_best["peak_over_plain_bytes"]])
    profiled, over = _gpu("profile")["result"]["on_device"], _gpu("overheads")["cells"]["85M"]
    jumping = (profiled["jump"]["ms"] + profiled["cycle_end"]["ms"]) / 20  # a jump and a cycle's end every 20 steps
    share = jumping / (1000 * min(over["steady_step_seconds"]["plain"]))
    own = json.loads((scale.RESULTS / "host_work" / "host_work.json").read_text())["counts"]
    host = [own[mode]["own_us"]["median"] / 1000 for mode in ("default_aside", "default_jumping")]
    text = (
        "**What to expect.** On a CPU the default rule (`outer`, below) reached plain Lightning's final validation "
        "loss with "
        f"{_median(longest, 'backward', 'default', '.2f', 'x')} fewer backward passes on a {longest.size}-"
        f"parameter char GPT trained on {longest.tokens_per_param:g} tokens a parameter (training tokens over "
        f"parameters). {_large_model(_measured([scale.Cell(s, scale.SHARED_LENGTH) for s in scale.SIZES]))} On one "
        f"H200 at 85M it took {median_over_seeds(at_best['backward_speedups']):.2f}x fewer in a run of only "
        f"{tokens_gpu:.1g} tokens a parameter. For a model of 100M or more trained to the end, expect about 1% fewer "
        "steps: what published records of rules that jump every K steps report at 124M and more (compared in arXiv "
        "2512.17131); it is not measured here. It costs "
        f"{copies:.0f} copies of the parameters in the H200's memory, {min(host):.2f}-{max(host):.2f} ms of host work "
        f"a step on the CPU (a tiny MLP's), and at most {share:.1%} of a step on the H200 (a cycle's end and a jump "
        "timed alone). To see what it does for your own module, run both side by side: `lightning-hybrid-train "
        "mode=compare`."
    )
    return textwrap.fill(text, 118, break_on_hyphens=False) + "\n"


def _gpu_memory(runs: dict) -> str:
    """Each arm's peak device memory over its seed's plain run, in copies of the model's fp32 parameters."""
    copies: dict[str, list[float]] = {}
    for row in gpu.comparisons(runs, gpu.best_rate(runs)).values():
        copies.setdefault(row["arm"], []).extend(b / (4 * gpu.PARAMETERS) for b in row["peak_over_plain_bytes"])
    said = [f"{'the default' if arm == 'default' else arm} {seeds_cell(c, '.2f', '')}" for arm, c in copies.items()]
    return (
        f"Peak device memory over plain's in the same pair, in copies of the {gpu.PARAMETERS:,} parameters in fp32: "
        + ", ".join(said)
        + "."
    )


def gpu_table() -> str:
    """The performance record's GPU tables (the sweep; each arm's medians and seeds) and timings."""
    runs, profiled, over = _gpu("quality")["runs"], _gpu("profile")["result"], _gpu("overheads")["cells"]["85M"]
    on_device, on_host = profiled["on_device"], profiled["on_host"]
    plain_ms = [1000 * v for v in over["steady_step_seconds"]["plain"]]
    steady = over["steady_ratios"]
    per_step = (on_device["jump"]["ms"] + on_device["cycle_end"]["ms"]) / 20
    timings = (
        f"Timed alone with the rule's state on the device, a jump took {on_device['jump']['ms']:.1f} ms (at most "
        f"{on_device['jump']['ms_max']:.1f}) and a cycle's end {on_device['cycle_end']['ms']:.1f} ms (at most "
        f"{on_device['cycle_end']['ms_max']:.1f}); with it on the host, {on_host['jump']['ms']:.1f} and "
        f"{on_host['cycle_end']['ms']:.1f} ms. The steady step over plain's, {len(plain_ms)} rounds: stepping aside "
        f"{seeds_cell(steady['default_aside'], '.3f')}, jumping every 20 steps "
        f"{seeds_cell(steady['default_jumping'], '.3f')}, while plain's own step ranged {min(plain_ms):.1f}-"
        f"{max(plain_ms):.1f} ms over the rounds. A cycle's end and jump every 20 steps come to {per_step:.2f} ms a "
        f"step, {per_step / min(plain_ms):.1%} of plain's fastest: the most they add where nothing overlaps them."
    )
    lines = [*gpu.sweep_table(runs), "", *gpu.comparison_tables(runs), "", textwrap.fill(timings, 118)]
    lines += ["", textwrap.fill(_gpu_memory(runs), 118)]
    return "\n".join(lines) + "\n"


# -- Lightning's own tests with the plugin inside (tests/lightning_inject.py) ---------------------------------------
def _lightning_runs() -> tuple[dict[str, Any], int, int]:
    """The record, and how many tests pass plain and with the plugin."""
    runs = json.loads((scale.RESULTS / "lightning_tests" / "outcomes.json").read_text())
    return runs, runs["plain"]["passed"], runs["default"]["passed"]


def lightning_tests() -> str:
    runs, plain, plugin = _lightning_runs()
    text = (
        f"Of {plain} of Lightning's own tests that pass plain, {plugin} pass with `HybridScheduler()` added to every "
        f"Trainer, its strategy kept; of the {plain - plugin} others, {len(runs['fail_with_any_callback'])} fail with "
        f"any stateful callback added and {len(runs['fail_with_the_plugin_only'])} want each logging step's logger "
        "calls Lightning's alone ([record](benchmarks/results/lightning_tests/README.md); "
        "[which](docs/how-it-works.md#compatibility))."
    )
    return textwrap.fill(text, 118, break_on_hyphens=False, break_long_words=False) + "\n"


def _names(tests: list[str]) -> str:
    return ", ".join(f"`{t.split('::')[-1]}`" for t in tests)


def lightning_tests_detail() -> str:
    runs, plain, plugin = _lightning_runs()
    text = (
        f"Lightning {runs['lightning_tests']} with {runs['lightning_installed']} installed: of {plain} tests that "
        f"pass plain, {plugin} pass with `HybridScheduler()` added to every Trainer, its own strategy kept "
        f"(`HYBRID_INJECT=default`). Of the {plain - plugin} others, {len(runs['fail_with_any_callback'])} fail as "
        f"they do with a stateful callback that does nothing in its place (`HYBRID_INJECT=inert`: "
        f"{_names(runs['fail_with_any_callback'])} compare the Trainer's exact callback list), and "
        f"{len(runs['fail_with_the_plugin_only'])} ({_names(runs['fail_with_the_plugin_only'])}) want each logging "
        "step's calls to the logger to be Lightning's alone: the plugin calls each logger itself, as "
        '`LearningRateMonitor` does (see "What you see").'
    )
    return textwrap.fill(text, 118, break_on_hyphens=False, break_long_words=False) + "\n"


def lightning_tests_table() -> str:
    runs = _lightning_runs()[0]
    rows = ["| run | passed | failed | skipped |", "|---|---|---|---|"]
    names = {"plain": "plain (`off`)", "inert": "a do-nothing stateful callback (`inert`)",
             "default": "`HybridScheduler()` (`default`)"}  # fmt: skip
    rows += [f"| {label} | {runs[key]['passed']} | {runs[key]['failed']} | {runs[key]['skipped']} |"
             for key, label in names.items()]  # fmt: skip
    return "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "readme-opening": readme_opening,
    "footprint-times": footprint.table,
    "footprint-sizes": footprint.sizes_table,
    "suite-time": footprint.suite_time,
    "lightning-tests": lightning_tests,
    "lightning-tests-detail": lightning_tests_detail,
    "lightning-tests-table": lightning_tests_table,
    "gpu-status": gpu_status,
    "gpu-table": gpu_table,
    "scale-status": scale_status,
    "scale-table": scale_table,
    "scale-verdict": scale_verdict,
    "scale-lost": scale_lost,
    "scale-sweeps": scale_sweeps,
    "lrs-default": lrs_default,
    "lrs-pairs": lrs_pairs,
    "lrs-configs": lrs_configs,
    "lrs-peers": lrs_peers,
    **settings_reference.GENERATORS,
}


def written(text: str, cache: dict[str, str]) -> str:
    """``text`` with each region's body replaced by its generator's output (each generator run once)."""

    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise KeyError(f"a region names no generator: {name!r} (known: {', '.join(GENERATORS)})")
        if name not in cache:
            cache[name] = GENERATORS[name]()
        return match[1] + cache[name] + match[4]

    return REGION.sub(body, text)


def stale() -> list[str]:
    """The documents whose regions differ from what the result files give."""
    cache: dict[str, str] = {}
    return [str(p.relative_to(ROOT)) for p in DOCUMENTS if written(p.read_text(), cache) != p.read_text()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale()
        raise SystemExit(f"stale: {', '.join(differ)}" if differ else 0)
    cache: dict[str, str] = {}
    for path in DOCUMENTS:
        path.write_text(written(path.read_text(), cache))


if __name__ == "__main__":
    main()
