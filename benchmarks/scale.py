"""What to expect at your scale: the default against plain Lightning as runs grow longer and models larger, paired.

    python -m benchmarks.scale run length     # the 0.47M char GPT at 1.5, 6 and 25 tokens per parameter
    python -m benchmarks.scale run size       # 0.47M, 1.2M and 3.3M parameters at 1.5 tokens per parameter
    python -m benchmarks.scale run length --block gpa            # primal averaging beside plain, in blocks of its own
    python -m benchmarks.scale run size --block gpa --cells 3.3M_1.5tpp --seeds 0   # one process a seed, side by side
    python -m benchmarks.scale run length --block gpa_scaled     # its average's window scaled to the run's length
    python -m benchmarks.scale report         # results/scale/README.md and its two plots

A cell is a model size trained for a number of tokens per parameter (2,048 byte tokens a step) on the standard
library with its tests, which no run reads twice. Its learning rate is plain's best final validation loss in a sweep
at the cell's own length (seed 0, cosine over the run, rates a factor of 2 apart, widened until the best lies inside).
Each seed is then one block, run in one process, one torch thread: plain, the default, and plain nudged to 1.001x the
rate (the noise floor: what chaos alone does to plain). Validation costs about a tenth of training. The default and
the control may train 1.5x plain's steps to reach its final loss. Primal averaging (``gpa``) runs in blocks of its
own, plain then ``gpa``, each compared with its own block's plain. A block's file is rewritten as each of its runs
ends; a block another process left unfinished is run again whole, so that every figure compares runs of one process
on one host.

The GPU grid (``GPU_GRID``, run by ``python -m benchmarks.gpu``'s ``grid`` part) takes the same cells to a GPU:
``Cell(size, tokens, "gpu")`` (see ``GPU_SIZES`` and the constants beside it), its results in ``results/scale_gpu``.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import open_dict

from benchmarks.curves import lowest_in_last_tenth, overfits, time_to_target
from benchmarks.harness import (
    PROCESS,
    RESULTS,
    Record,
    baseline_target,
    fit,
    gpa_mu_x,
    machine,
    now,
    record_from,
    stamp,
    warm_up,
    write_atomic,
)
from benchmarks.report import median_over_seeds, seeds_cell
from benchmarks.tasks import Length, compose_run, hybrid_steps, trainer_steps

TASK = "char_gpt_scale"
OUT = RESULTS / "scale"
TOKENS_PER_STEP = 32 * 64  # the char GPT's batch: 32 windows of 64 bytes
SIZES = {"0.47M": (2, 128, 4), "1.2M": (3, 176, 4), "3.3M": (4, 256, 8)}  # layers, width, heads
CENTRE = {"0.47M": 6e-3, "1.2M": 4e-3, "3.3M": 3e-3}  # each size's first sweep rate, near earlier tuned rates
SHARED_LENGTH = 1.5  # tokens per parameter of the size grid: a 3.3M cell takes about 3.5 hours on one core there
GRIDS = {
    "length": [("0.47M", 1.5), ("0.47M", 6.0), ("0.47M", 25.0)],
    "size": [(size, SHARED_LENGTH) for size in SIZES],
}
SEEDS = 3
# The GPU grid (``benchmarks.gpu``'s ``grid`` part): the CPU grid's 3.3M cell (its batch: the machines compared) and
# two larger sizes on wider batches, in bf16 with fused AdamW, the decisive cells first: sizes at 1.5 tokens a
# parameter, then the two smaller at 6. Each size's rate: the best of three in plain's sweep at 1.5 tokens a
# parameter whose curve is lowest in its last tenth; each seed's plain, default and nudged plain in one process, plain
# first in even seeds and last in odd (a run's place in the process favours neither).
GPU_OUT = RESULTS / "scale_gpu"
GPU_SIZES = {"3.3M": SIZES["3.3M"], "17M": (8, 416, 8), "43M": (12, 544, 8)}
GPU_BATCHES = {"17M": (64, 256), "43M": (128, 256)}  # windows a batch, bytes a window (elsewhere the CPU's 32 x 64)
GPU_RATES = {"3.3M": (1.5e-3, 3e-3, 6e-3), "17M": (1e-3, 2e-3, 4e-3), "43M": (6e-4, 1.2e-3, 2.4e-3)}
GPU_GRID = [("3.3M", 1.5), ("17M", 1.5), ("43M", 1.5), ("3.3M", 6.0), ("17M", 6.0)]
GPU_SEEDS = 2
GPU_TASK = "char_gpt_scale_gpu"
GPU_OVERRIDES = ["trainer=gpu", "model.fused=true"]
DRY_SIZES, DRY_RATES = {"dry": (1, 32, 2)}, {"dry": (3e-3, 6e-3, 1.2e-2)}  # the dry run's: the GPU grid on a CPU
DRY_VALIDATIONS = 5  # its runs of 20 steps (primal averaging scales its window to no fewer)
VALIDATIONS = 20  # a run's; the suite's cells of a few dozen steps validate less often (validation was most of them)
# configuration -> (overrides, the rate's factor); the hybrid ones run with the plugin
CONFIGS = {
    "default": ([], 1.0),
    "nudged": ([], 1.001),
    "gpa": (["predictor=gpa"], 1.0),
    "gpa_scaled": (["predictor=gpa"], 1.0),  # its window scaled to the run (harness.gpa_mu_x): overrides_of
}
HYBRID_CONFIGS = ("default", "gpa", "gpa_scaled")
BLOCKS = {"default": ("default", "nudged"), "gpa": ("gpa",), "gpa_scaled": ("gpa_scaled",)}  # after plain, by name


def overrides_of(cell: Cell, config: str) -> tuple[list[str], float]:
    """``config``'s overrides in ``cell`` and its rate's factor."""
    overrides, factor = CONFIGS.get(config, ([], 1.0))
    if config == "gpa_scaled":
        overrides = [*overrides, f"predictor.mu_x={gpa_mu_x(cell.length.steps):.6f}"]
    return overrides, factor


@dataclass(frozen=True)
class Cell:
    """A size trained for a number of tokens a parameter, on a ``machine``: ``cpu`` (the CPU grid), ``gpu`` (the
    GPU grid) or ``dry`` (the GPU grid's code at a tiny size on the CPU, in ``root``)."""

    size: str
    tokens_per_param: float
    machine: str = "cpu"
    root: str = ""

    @property
    def name(self) -> str:
        return f"{self.size}_{self.tokens_per_param:g}tpp"

    @property
    def on_cpu_grid(self) -> bool:
        return self.machine == "cpu"

    @property
    def dims(self) -> tuple[int, int, int]:
        return {"cpu": SIZES, "gpu": GPU_SIZES, "dry": DRY_SIZES}[self.machine][self.size]

    @property
    def batch(self) -> tuple[int, int] | None:
        return GPU_BATCHES.get(self.size) if self.machine == "gpu" else None

    @property
    def overrides(self) -> list[str]:
        layers, width, heads = self.dims
        out = [f"model.n_layer={layers}", f"model.n_embd={width}", f"model.n_head={heads}"]
        if self.batch is not None:
            out += [f"data.batch_size={self.batch[0]}", f"data.block_size={self.batch[1]}"]
        return out + (GPU_OVERRIDES if self.machine == "gpu" else [])

    @property
    def tokens_per_step(self) -> int:
        return TOKENS_PER_STEP if self.batch is None else self.batch[0] * self.batch[1]

    @property
    def task(self) -> str:
        return TASK if self.on_cpu_grid else GPU_TASK

    @property
    def seeds(self) -> int:
        return SEEDS if self.on_cpu_grid else GPU_SEEDS

    @property
    def folder(self) -> Path:
        return Path(self.root or (OUT if self.on_cpu_grid else GPU_OUT)) / self.name

    @property
    def swept(self) -> Cell:
        """The cell whose sweep gives this one's rate: itself on the CPU; on the GPU its size's shortest cell."""
        return self if self.on_cpu_grid else replace(self, tokens_per_param=SHARED_LENGTH)

    @property
    def params(self) -> int:
        return parameters(*self.dims)

    @property
    def length(self) -> Length:
        validations = DRY_VALIDATIONS if self.machine == "dry" else VALIDATIONS
        every = max(1, round(self.tokens_per_param * self.params / self.tokens_per_step / validations))
        steps = validations * every  # validated that many times, the last at its end
        return Length(steps, every, val_batches(steps), self.name)


def val_batches(steps: int) -> int:
    """Validation batches for a run of ``steps``: a tenth of training's cost (20 validations, a forward about a third
    of a step), at least 10. Ten batches (20 KB of one or two files) swung the 0.47M curve by 1% between validations
    at the end of 25 tokens a parameter, as much as the effect to be measured."""
    return max(10, round(0.1 * steps * 3 / 20))


def every_cell() -> list[Cell]:
    """The cells of both grids, each once (the smallest is in both), in the grids' order."""
    return list(dict.fromkeys(Cell(size, tokens) for cells in GRIDS.values() for size, tokens in cells))


@functools.cache
def parameters(layers: int, width: int, heads: int) -> int:
    from lightning_hybrid.demos.char_gpt import CharGPT

    return sum(p.numel() for p in CharGPT(n_layer=layers, n_embd=width, n_head=heads).parameters())


def _stamp(started: str) -> dict[str, Any]:
    return {"machine": machine(), **stamp(started)}


def _fit(cell: Cell, lr: float, seed: int, config: str, workdir: str, baseline: Record | None) -> dict[str, Any]:
    """One run of the cell at ``lr`` (``config``: plain, or a configuration against ``baseline``), as its file holds
    it."""
    overrides, factor = overrides_of(cell, config)
    spec = cell.length
    cfg = compose_run(cell.task, spec, seed, [*cell.overrides, f"model.lr={lr * factor}", *overrides], workdir)
    stop = None
    if baseline is not None:  # plain ran first: the others may go on to its final loss; else they run its steps
        with open_dict(cfg):
            cfg.trainer.max_steps = trainer_steps(cell.task, hybrid_steps(spec))
        stop = baseline_target(baseline, spec)
    started = now()
    record = fit(cfg, hybrid=config in HYBRID_CONFIGS, stop=stop)
    print(f"{cell.name} lr {lr:.3g} seed {seed} {config}: final val loss {record.curve.losses[-1]:.4f}", flush=True)
    figures = {"config": config, "trained_lr": lr * factor, "val_batches": spec.val_batches}
    return {**figures, **_stamp(started), **record.to_dict()}


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1))


def sweep(cell: Cell, workdir: str) -> float:
    """The cell's tuned rate: plain (seed 0) at rates a factor of 2 apart from the size's centre, widened toward
    the better side until the best final validation loss lies inside; each run is kept in ``sweep.json``."""
    cell = cell.swept  # on the GPU: three rates at the size's shortest length, which its longer cells take too
    path = cell.folder / "sweep.json"
    runs: dict[str, Any] = (_read(path) or {}).get("runs", {})
    if cell.on_cpu_grid:
        rates = [CENTRE[cell.size] / 2, CENTRE[cell.size], CENTRE[cell.size] * 2]
    else:
        rates = list({**GPU_RATES, **DRY_RATES}[cell.size])
    while True:
        for lr in rates:
            if f"{lr:.6g}" not in runs:
                runs[f"{lr:.6g}"] = _fit(cell, lr, 0, "plain", workdir, None)
                _write(path, {"cell": cell.name, "steps": cell.length.steps, "runs": runs})
        best = tuned(runs, settled=not cell.on_cpu_grid)
        if not cell.on_cpu_grid:
            return best
        if best == min(rates):
            rates.insert(0, best / 2)
        elif best == max(rates):
            rates.append(best * 2)
        else:
            return best


def tuned(runs: dict[str, Any], settled: bool = False) -> float:
    """The rate of the best final validation loss (a non-finite loss is the worst); ``settled``: among the curves
    lowest in their last tenth where any is (a curve lowest earlier gives no time to its final loss)."""
    finals = {float(lr): run["points"][-1]["val_loss"] for lr, run in runs.items()}
    if settled:
        late = {float(lr) for lr, run in runs.items() if lowest_in_last_tenth([p["val_loss"] for p in run["points"]])}
        finals = {lr: v for lr, v in finals.items() if lr in late} or finals
    return min(finals, key=lambda lr: finals[lr] if finals[lr] == finals[lr] else float("inf"))


def block_path(cell: Cell, seed: int, configs: tuple[str, ...] = BLOCKS["default"]) -> Path:
    return cell.folder / f"seed{seed}_{'_'.join(configs)}.json"


def block(cell: Cell, seed: int, lr: float, workdir: str, configs: tuple[str, ...] = BLOCKS["default"]) -> None:
    """Plain, then each of ``configs`` against it, in this process: the block's file is rewritten as each run ends,
    and a block another process left unfinished is run again from plain. Seed 0's plain is the sweep's run at the
    rate where this process made it."""
    path = block_path(cell, seed, configs)
    done = _read(path)
    if done is not None and set(done["runs"]) == {"plain", *configs}:
        return
    if done is None or done["process"] != PROCESS or done["lr"] != lr:
        done = {"cell": cell.name, "seed": seed, "lr": lr, "steps": cell.length.steps, "process": PROCESS, "runs": {}}
        swept = (_read(cell.folder / "sweep.json") or {"runs": {}})["runs"].get(f"{lr:.6g}")
        if seed == 0 and swept is not None and swept["process"] == PROCESS:
            done["runs"]["plain"] = swept
    runs = done["runs"]
    last = not cell.on_cpu_grid and seed % 2 == 1  # the GPU grid's odd seeds run plain last
    for config in (*configs, "plain") if last else ("plain", *configs):
        if config not in runs:
            baseline = record_from(runs["plain"]) if config != "plain" and "plain" in runs else None
            runs[config] = _fit(cell, lr, seed, config, workdir, baseline)
            _write(path, done)


def run(
    grid: str, seeds: tuple[int, ...] = tuple(range(SEEDS)), name: str = "default", only: tuple[str, ...] | None = None
) -> None:
    """The grid's cells (those named in ``only``) with blocks of ``BLOCKS[name]`` for ``seeds``, the costliest cell
    first: the smallest is in both grids, run by whichever comes to it first. Two processes share a cell's seeds
    by naming different ones."""
    cells = [c for c in (Cell(*c) for c in GRIDS[grid]) if only is None or c.name in only]
    with tempfile.TemporaryDirectory() as workdir:
        for cell in sorted(cells, key=lambda c: c.params**2 * c.tokens_per_param)[::-1]:
            run_cell(cell, seeds, BLOCKS[name], workdir)


def run_cell(
    cell: Cell,
    seeds: tuple[int, ...],
    configs: tuple[str, ...],
    workdir: str,
    room: Callable[[int], bool] = lambda runs: True,
) -> bool:
    """The cell's sweep and a block of ``configs`` for each of ``seeds``, after a discarded warm-up run (the first
    run in a process paid for one-time costs), unless every block is in. ``room(runs)``: whether that many runs of
    the cell still fit, asked before the sweep and each block; whether every block is in."""
    left = [seed for seed in seeds if not _complete(cell, seed, configs)]
    if not left:
        return True
    if not room(3 + 1 + len(configs)):  # the sweep's runs at most, the warm-up and a block
        return False
    warm_up(cell.task, cell.length, cell.overrides, workdir)
    lr = sweep(cell, workdir)
    for seed in left:
        if not room(1 + len(configs)):
            return False
        block(cell, seed, lr, workdir, configs)
    return True


def runs_left(cell: Cell, configs: tuple[str, ...]) -> int:
    """At most the runs that blocks of ``configs`` still need in ``cell`` over its seeds, with the sweep's where the
    default's blocks would start it (seed 0's plain counted, though the sweep may give it)."""
    blocks = [_read(block_path(cell, seed, configs)) or {} for seed in range(cell.seeds)]
    left = sum(1 + len(configs) - len(b.get("runs", {})) for b in blocks)
    swept = _read(cell.swept.folder / "sweep.json") or {}
    return left + (3 - len(swept.get("runs", {})) if configs == BLOCKS["default"] else 0)


def _complete(cell: Cell, seed: int, configs: tuple[str, ...]) -> bool:
    done = _read(block_path(cell, seed, configs))
    return done is not None and set(done["runs"]) == {"plain", *configs}


# -- the report: per grid, a table of every cell and a plot of the gain against the grid's axis ---------------------
AXES = {"backward": "backward passes", "cpu_s": "CPU time"}
GPU_AXES = {"backward": "backward passes", "wall_s": "wall time"}  # one process alone on the device: wall time


def axes_of(cell: Cell) -> dict[str, str]:
    return AXES if cell.on_cpu_grid else GPU_AXES


def seed_figures(done: dict[str, Any], config: str, axes: dict[str, str] = AXES) -> dict[str, Any]:
    """One block's figures for ``config`` against its plain: per axis plain's time to plain's final loss over the
    configuration's (``None`` where it never got there, or where plain's curve turned up at its end: no target),
    the loss at plain's last step over plain's, and the jumps."""
    plain, other = record_from(done["runs"]["plain"]), done["runs"][config]
    theirs = record_from(other)
    target, overfit = plain.curve.losses[-1], overfits(plain.curve.losses)
    out: dict[str, Any] = {"overfit": overfit}
    for axis in axes:
        mine = time_to_target(plain.curve.axis(axis), plain.curve.losses, target)
        them = time_to_target(theirs.curve.axis(axis), theirs.curve.losses, target)
        out[axis] = mine / them if mine and them and not overfit else None
    at = theirs.curve.at_step(plain.curve.points[-1].step)
    out["loss"] = None if at is None else at / target
    out |= {"made": other["segments_started"], "undone": other["rollbacks"], "kept": other.get("jumps_kept", 0)}
    return out


def cell_figures(cell: Cell) -> dict[str, Any] | None:
    """Everything the report says of a cell, from its files; ``None`` before its sweep has begun."""
    sweep_file = _read(cell.swept.folder / "sweep.json")
    if sweep_file is None:
        return None
    read = {
        name: [_read(block_path(cell, seed, configs)) for seed in range(cell.seeds)] for name, configs in BLOCKS.items()
    }
    blocks = {name: [b for b in found if b and "plain" in b["runs"]] for name, found in read.items()}
    axes = axes_of(cell)
    figures = {
        c: [seed_figures(b, c, axes) for b in blocks[n] if c in b["runs"]] for n, cs in BLOCKS.items() for c in cs
    }
    plains = [record_from(b["runs"]["plain"]).curve for b in blocks["default"]]
    lowest = [c.points[min(range(len(c.losses)), key=c.losses.__getitem__)].step for c in plains]
    sweep_losses = {float(lr): r["points"][-1]["val_loss"] for lr, r in sweep_file["runs"].items()}
    return {
        "sweep": dict(sorted(sweep_losses.items())),
        "sweep_val_batches": ", ".join(
            sorted({str(r["val_batches"]) for r in sweep_file["runs"].values() if "val_batches" in r})
        ),
        "lr": blocks["default"][0]["lr"] if blocks["default"] else None,
        **figures,
        "plain_lowest_at": lowest,
        "plain_steps": cell.length.steps,
    }


def _cell(values: list[float | None], fmt: str = ".2f", suffix: str = "x") -> str:
    return seeds_cell(values, fmt, suffix) if values else "-"


def grid_table(grid: str) -> str:
    return cells_table([Cell(size, tokens) for size, tokens in GRIDS[grid]])


def cells_table(cells: list[Cell]) -> str:
    """For each cell, plain's time to its final loss over the default's, primal averaging's (``gpa``) and the nudged
    control's (medians, ranges over seeds, each against the plain run of its own block), the loss at plain's last
    step over plain's (the control's beside, as its noise floor), and the default's jumps in each seed."""
    shown = ("default", *(c for c in BLOCKS if c.startswith("gpa")), "nudged")
    axes = axes_of(cells[0]) if cells else AXES
    heads = [f"{label}: {'nudged plain' if c == 'nudged' else c}" for label in axes.values() for c in shown]
    heads += ["loss at equal steps: default", *shown[1:-1], "nudged plain", "the default's jumps kept of made (undone)"]
    lines = ["| cell | parameters | tokens a parameter | steps | rate | seeds | " + " | ".join(heads) + " |"]
    lines.append("|---" * (6 + len(heads)) + "|")
    for cell in cells:
        f = cell_figures(cell)
        head = f"| {cell.name} | {cell.params / 1e6:.2f}M | {cell.tokens_per_param:g} | {cell.length.steps} |"
        if f is None or not f["default"]:
            lines.append(head + " not run yet |" + " |" * len(heads) + " |")
            continue
        over = sum(s["overfit"] for s in f["default"])
        gains = [_cell([s[a] for s in f[c]]) for a in axes for c in shown]
        losses = [_cell([s["loss"] for s in f[c]], ".3f", "") for c in shown]
        jumps = "; ".join(f"{s['kept']} of {s['made']} ({s['undone']})" for s in f["default"])
        seeds = f"{len(f['default'])}" + (f" (plain overfits in {over})" if over else "")
        lines.append(f"{head} {f['lr']:.3g} | {seeds} | " + " | ".join([*gains, *losses, jumps]) + " |")
    return "\n".join(lines)


PANELS = {**AXES, "loss": "loss at plain's last step"}  # the loss's spread over seeds is the tightest
STYLES = {
    "default": {"marker": "o"},
    "gpa": {"marker": "^"},
    "gpa_scaled": {"marker": "v"},
    "nudged": {"marker": "s", "linestyle": ":"},
}


@dataclass(frozen=True)
class Point:
    """One configuration in one cell of a plot, by the tables' rule (``benchmarks.report.seeds_cell``): the median
    over seeds, a seed that never reached plain's loss counting as the slowest (``None`` where half or more never
    did), the range of those that reached it, and how many did not."""

    x: float
    median: float | None
    low: float | None
    high: float | None
    missed: int
    seeds: int


def plot_points(grid: str, panel: str, config: str) -> list[Point]:
    """``config``'s points in ``panel`` (an axis of ``AXES``, or ``"loss"``) along the grid's cells that ran it."""
    points = []
    for cell in (Cell(size, tokens) for size, tokens in GRIDS[grid]):
        values = [s[panel] for s in ((cell_figures(cell) or {}).get(config) or [])]
        if values:
            known = [v for v in values if v is not None]
            x = cell.tokens_per_param if grid == "length" else cell.params / 1e6
            low, high = (min(known), max(known)) if known else (None, None)
            points.append(Point(x, median_over_seeds(values), low, high, len(values) - len(known), len(values)))
    return points


def plot(grid: str, path: Path) -> None:
    """:func:`figure` of ``grid``, written to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(grid)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(grid: str) -> Any:
    """Each rule's figures (median and range over seeds, by the tables' rule) against the grid's axis, beside the
    nudged control's: backward passes and CPU time to plain's final loss, and the loss at plain's last step. A seed
    that never got there is drawn at the panel's foot, counted ("1/3": one of three seeds missed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 3.8))
    for ax, (panel, label) in zip(axes, PANELS.items()):
        for shift, (config, style) in enumerate(STYLES.items()):
            points, colour = plot_points(grid, panel, config), colours[shift]
            nudge = 1.03 ** (shift - 1.5)  # side by side, so the ranges do not hide one another
            drawn = [p for p in points if p.median is not None]
            if drawn:
                below = [p.median - p.low for p in drawn]
                above = [p.high - p.median for p in drawn]
                ax.errorbar([p.x * nudge for p in drawn], [p.median for p in drawn], yerr=[below, above],
                            capsize=3, label=config, color=colour, **style)  # fmt: skip
            for p in (p for p in points if p.missed):  # at the foot, one row a configuration
                foot = ax.get_xaxis_transform()
                ax.plot(p.x * nudge, 0.04 + 0.07 * shift, marker="x", color=colour, transform=foot)
                ax.annotate(f" {p.missed}/{p.seeds}", (p.x * nudge, 0.04 + 0.07 * shift), xycoords=foot,
                            fontsize=7, color=colour, va="center")  # fmt: skip
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        xs = sorted({p.x for config in STYLES for p in plot_points(grid, panel, config)})
        ax.set_xticks(xs, [f"{x:.2g}" for x in xs])  # plain numbers, not 2x10^0
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("tokens per parameter" if grid == "length" else "parameters (millions)")
        ax.set_title(f"{label}, run / plain" if panel == "loss" else f"{label} to plain's final loss, plain / run",
                     fontsize=9)  # fmt: skip
        ax.legend(fontsize=7)
    fig.suptitle(
        "the 0.47M char GPT as runs grow longer (x: seeds that never reached plain's loss)"
        if grid == "length"
        else f"the char GPT as it grows, at {SHARED_LENGTH:g} tokens a parameter (x: seeds that never reached it)"
    )
    fig.tight_layout()
    return fig


def sweeps() -> str:
    """Each cell's sweep (seed 0, final validation loss by rate), and where each seed's plain curve was lowest: a
    curve lowest before its end would void the cell's time to target (none is given where it rose over 1%)."""
    lines = []
    for cell in every_cell():
        f = cell_figures(cell)
        if f is not None:
            finals = ", ".join(f"{lr:.3g}: {loss:.4f}" for lr, loss in f["sweep"].items())
            low = ", ".join(map(str, f["plain_lowest_at"])) or "-"
            batches = f", validated on {f['sweep_val_batches']} batches" if f["sweep_val_batches"] else ""
            head = f"{cell.name} ({cell.length.steps} steps{batches})"
            lines.append(f"- {head}: {finals}; plain lowest at steps {low}")
    return "\n".join(lines) or "No sweep yet."


def report() -> str:
    """``results/scale/README.md`` (every cell's figures, made from the block files) and the two plots."""
    sections = []
    for grid in GRIDS:
        sections.append(
            f"## {'As runs grow longer' if grid == 'length' else 'As models grow larger'}\n\n"
            + grid_table(grid)
            + f"\n\n![{grid}](gain_by_{grid}.png)"
        )
        plot(grid, OUT / f"gain_by_{grid}.png")
    text = "# What to expect at your scale\n\n" + __doc__.split("\n\n")[2].strip() + "\n\nMade by `python -m "
    text += "benchmarks.scale report` from the files beside it.\n\n" + "\n\n".join(sections)
    text += "\n\n## Plain's sweeps (seed 0, final validation loss by rate)\n\n" + sweeps() + "\n"
    write_atomic(OUT / "README.md", text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("grid", nargs="?", choices=tuple(GRIDS), help="run: the grid")
    parser.add_argument(
        "--seeds", nargs="+", type=int, choices=range(SEEDS), default=tuple(range(SEEDS)), help="run: these seeds"
    )
    parser.add_argument(
        "--block", choices=tuple(BLOCKS), default="default", help="run: what each seed runs beside plain"
    )
    names = tuple(cell.name for cell in every_cell())
    parser.add_argument("--cells", nargs="+", choices=names, help="run: these of the grid's cells (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.action == "run":
        run(args.grid, tuple(args.seeds), args.block, args.cells and tuple(args.cells))
    else:
        print(report())


if __name__ == "__main__":
    main()
