"""The GPU command, for the session that is lent a GPU: it prints its plan and estimated minutes first, runs the
plan's parts in order while they fit the call's budget, writes each result as soon as it ends, and a later call
resumes from those results (a run already recorded is never run again).

    python -m benchmarks.gpu                       # the plan's first call, about 6.5 minutes: the grid first
    python -m benchmarks.gpu --budget-min 5        # the second: the grid goes on where the first stopped
    python -m benchmarks.gpu --parts sync memory   # the mechanics checks, by name
    python -m benchmarks.gpu --parts kernels       # the rules' Triton kernels on the GPU, about 2 minutes
    python -m benchmarks.gpu --dry-run             # on the CPU at tiny sizes: the suite runs it so it cannot rot
    python -m benchmarks.gpu --report --out DIR    # DIR's README.md rewritten from its files, nothing run

By default a call runs the grid, then what the first GPU run (2026-11-28) left: the GPU's busy share (``profile``)
and ``overheads_adamw``. The grid is ``benchmarks.scale``'s GPU cells (``GPU_GRID``): the char GPT at 3.3M (the CPU
grid's cell, on its batch), 17M and 43M at 1.5 tokens a parameter, then 3.3M and 17M at 6, then primal averaging
(its window scaled) at each size's longest cell; bf16, fused AdamW, cosine to the end of each run. Each size's rate
is the best of three in plain's sweep at 1.5 tokens a parameter among curves lowest in their last tenth; each seed
(2) runs plain, the default and nudged plain in one process after a discarded warm-up run, plain first in even seeds
and last in odd. The plan estimates each cell from its steps (``GRID_STEP_S``); a block starts only where its runs
fit the call, each run is written as it ends (into ``benchmarks/results/scale_gpu``), and a block another process
left unfinished runs again whole. Estimated, the size axis alone takes over 20 minutes and the whole grid about 70:
more than a session's device time, so it continues across sessions, the decisive cells first.

The 85M parts (run on 2026-11-28; by name with ``--parts``), on the GPT-2-shaped character GPT in bf16 with fused
AdamW (``char_gpt_gpt2``: 16 MB of the standard library with its tests, so no run reads a byte twice):

1. ``sweep``: plain at 3 rates, 1,000 steps, cosine over the run, seed 0.
2. ``quality``: the default against plain at the sweep's best rate (the lowest final loss of a curve that does not
   turn up), 3 seeds, plain first in even seeds and last in odd (plain's seed 0 is the sweep's run): backward passes
   and wall time to plain's final validation loss, the loss at equal steps, and plain's wall time for the whole run
   over the arm's (the machine's noise); no time to target where plain's curve turns up at its end.
3. ``quality_gpa``, where ``GPA_ARM`` is on (always in the dry run): primal averaging (``predictor=gpa``, its
   average's window scaled to the run) against the same plain runs at the best rate, 3 seeds.
4. ``profile``: the default jumping every 20 steps, each cycle's end and each jump timed alone (synchronised) and
   counted (operations, host reads), with the state on the device and on the host; and 20 steps profiled with
   torch.profiler: the GPU's busy share of a step (kernel time against wall time), which says whether the host or
   the GPU sets the pace.
5. ``quality`` at a third of the best rate, as at it.
6. ``overheads``: plain Lightning and the default stepping aside and jumping every 20 steps, alternating in this
   process, 3 rounds of 200 steps: the steady step's wall time over plain's, with a clock that synchronises only
   where its window starts and ends (the host runs ahead of the device, as in a user's run); then
   ``overheads_adamw``, the same with torch's default AdamW (every quiet step reads the guard to the host).

The mechanics parts (``sync``, ``memory``, ``offload``, ``outer_memory``, ``fp16``, ``fsdp``) run when named.
Results in ``--out`` (default ``benchmarks/results/gpu/<date>``): ``grid.json`` (what the call completed and what
waits, and the grid's table), ``overheads.json``, ``profile.json``, ``quality.json`` (the sweep's runs and the
comparisons too), ``mechanics.json`` and ``README.md``. A part that fails
is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import scale
from benchmarks.curves import overfits
from benchmarks.gpu_mechanics import CUDA, MECHANICS, TINY_GPT, Call
from benchmarks.harness import (
    RESULTS,
    against_plain,
    compare_seed,
    fit,
    gpa_mu_x,
    gpt_config,
    machine,
    now,
    record_from,
    stamp,
    write_atomic,
)
from benchmarks.jump_cost import JUMPING, SMALL_GPT2, BusyWindow, measure
from benchmarks.report import median_over_seeds, seeds_cell

# -- the plan's parts and their estimates ---------------------------------------------------------------------------
ASIDE = ["predictor=outer", "predictor.verify_resolution=1e-12", "hybrid.warmup_steps=20", "hybrid.full_steps=20"]
ASIDE += ["model.warmup_steps=10"]  # as JUMPING: the rate stops rising before the first cycle
OVERHEAD_MODES = {
    "default_aside": ASIDE,  # no cycle judged: no jump, the cost of the steps between jumps
    "default_jumping": JUMPING,  # a jump every cycle, the rule's state on the device (the default)
}
# cell -> (overrides of every run, plain's included; modes)
OVERHEAD_CELLS = {"85M": ([], tuple(OVERHEAD_MODES)), "85M_adamw": (["model.fused=false"], tuple(OVERHEAD_MODES))}
OVERHEAD_WHAT = {
    "85M": "85M: plain, the default stepping aside and jumping every 20 steps, 3 rounds",
    "85M_adamw": "85M, torch's AdamW: the same",
}
OVERHEAD_ROUNDS, OVERHEAD_STEPS = 3, 200  # 200: eight jumps, at steps 61, 81, ...
PROFILE_STEPS, BUSY_START = 100, 45  # the profiled window: steps 45-65, a jump (step 61) in it
# the profiled window's steps; the suite's dry run profiles fewer, since torch's parse of a window's CPU events (10,000
# a step of the dry run's 149 tensors) takes about a second a step
BUSY_STEPS = 20
SWEEP_RATES = (3e-4, 6e-4, 1.2e-3)  # plain's rates at 1,000 steps; GPT-2 small trains at 6e-4
QUALITY_STEPS, QUALITY_SEEDS = 1000, 3
PARAMETERS = 85_645_824  # the 85M model's, counted (a test builds it): the record's tokens a parameter and copies
QUALITY_RATES = (1.0, 1 / 3)  # factors of the sweep's best rate
# what runs against plain, by name: overrides. Primal averaging with its average's window scaled to the run (mu_x
# 0.981 at 1,000 steps): on the CPU grid the published 0.9967 lost 3% at equal steps in runs of 1,380 steps, the
# scaled window came within 1% of plain (benchmarks/results/scale, gpa_scaled)
ARMS = {"default": [], "gpa": ["predictor=gpa", f"predictor.mu_x={gpa_mu_x(QUALITY_STEPS)}"]}
# Primal averaging as a third arm at the best rate: off since it ran on an H200 (2026-11-28), where it never reached
# plain's final loss in 3 of 3 seeds; the dry run still rehearses it
GPA_ARM = False
# an H200's bf16 step at 85M, in seconds (host-paced: 2026-11-27), each run's start (model, the 16 MB corpus read
# and hashed, Trainer) and the share validation adds: what the plan is estimated from
STEP_S, RUN_START_S, VALIDATION = 0.027, 3.0, 1.2
BUDGET_MIN = 6.5  # the first call's share of the device (the second's: --budget-min 5): parts start while they fit
RUN_MINUTES = (RUN_START_S + QUALITY_STEPS * STEP_S * VALIDATION) / 60


def _overhead_minutes(cell: str) -> float:
    return OVERHEAD_ROUNDS * (1 + len(OVERHEAD_CELLS[cell][1])) * (RUN_START_S + OVERHEAD_STEPS * STEP_S) / 60


PROFILE_MINUTES = 7 * (RUN_START_S + PROFILE_STEPS * STEP_S) / 60  # 2 fits each: fused, eager, on the host


def _key(lr: float, seed: int, config: str) -> str:
    return f"lr{lr:.3g}_seed{seed}_{config}"


def best_rate(runs: dict[str, Any]) -> float | None:
    """The sweep's best rate: the lowest final validation loss among plain's curves that do not turn up at their
    end (of every one, if all do); ``None`` until every sweep rate has run."""
    curves = {lr: runs.get(_key(lr, 0, "plain")) for lr in SWEEP_RATES}
    if any(c is None for c in curves.values()):
        return None
    finals = {lr: [p["val_loss"] for p in c["points"]] for lr, c in curves.items()}
    clean = {lr: losses for lr, losses in finals.items() if not overfits(losses)} or finals
    return min(clean, key=lambda lr: clean[lr][-1] if math.isfinite(clean[lr][-1]) else math.inf)


def _quality_keys(best: float, factor: float, arm: str = "default") -> list[str]:
    lr = best * factor
    return [_key(lr, s, c) for s in range(QUALITY_SEEDS) for c in ("plain", arm)]


def _quality_row(best: float | None, factor: float, arm: str, runs: dict[str, Any]) -> tuple[str, str, float] | None:
    """The row of an arm against plain at a factor of the best rate, with the runs it has left (``None``: none)."""
    keys = _quality_keys(best if best is not None else 1.0, factor, arm)
    left = [k for k in keys if k not in runs and (arm == "default" or k.endswith(arm))]
    if factor == 1.0 and best is None and arm == "default":
        left = left[1:]  # plain's seed 0 at the best rate is the sweep's run
    if not left:
        return None
    rate = "the sweep's best rate" if best is None else f"{best:.3g}"
    if factor != 1.0:
        rate = f"a third of {rate}" if best is None else f"{best * factor:.3g}, a third of {rate}"
    what = "plain and the default" if arm == "default" else "primal averaging (gpa)"
    return (
        "quality" if arm == "default" else f"quality_{arm}",
        f"85M at {rate}: {what}, 3 seeds",
        len(left) * RUN_MINUTES,
    )


def plan(
    done: dict[str, Any] | None = None, gpa: bool = GPA_ARM, dry_grid: Path | None = None
) -> list[tuple[str, str, float]]:
    """What is left to run, the decisive figure first, with its estimated minutes on an H200: ``(part, what,
    minutes)``; ``gpa``: with primal averaging's arm; ``dry_grid``: the dry run's grid folder (its tiny cell)."""
    done = done or {}
    cells = done.get("overheads", {}).get("cells", {})
    runs = done.get("quality", {}).get("runs", {})
    rows = []
    for cell, configs in grid_cells(dry_grid):
        left = scale.runs_left(cell, configs)
        if left:
            what = "plain, the default, nudged plain" if configs == scale.BLOCKS["default"] else "plain, gpa (scaled)"
            rows.append(
                ("grid", f"{cell.name} ({cell.length.steps} steps): {what}, {left} runs", left * grid_run_minutes(cell))
            )
    sweep = [lr for lr in SWEEP_RATES if _key(lr, 0, "plain") not in runs]
    if sweep:
        rates = ", ".join(f"{lr:.3g}" for lr in sweep)
        rows.append(("sweep", f"85M plain at {rates}: 1,000 steps, seed 0", len(sweep) * RUN_MINUTES))
    best = best_rate(runs)
    rows += [_quality_row(best, 1.0, "default", runs), _quality_row(best, 1.0, "gpa", runs) if gpa else None]
    if _unfinished(done.get("profile", {}).get("result")):
        rows.append(("profile", "85M: cycle ends and jumps timed and counted; 20 steps profiled", PROFILE_MINUTES))
    rows.append(_quality_row(best, QUALITY_RATES[1], "default", runs))
    for part, cell in (("overheads", "85M"), ("overheads_adamw", "85M_adamw")):
        if _unfinished(cells.get(cell)):
            rows.append((part, OVERHEAD_WHAT[cell], _overhead_minutes(cell)))
    return [row for row in rows if row is not None]


def this_call(rows: list[tuple[str, str, float]], budget_min: float, dry: bool) -> list[tuple[str, str, float]]:
    """The rows a call runs: in order while their estimates fit ``budget_min`` (the first always; all, dry)."""
    taken, minutes = [], 0.0
    for row in rows:
        if taken and minutes + row[2] > budget_min and not dry:
            break
        taken.append(row)
        minutes += row[2]
    return taken


# -- the grid: benchmarks.scale's GPU cells, the decisive first ---------------------------------------------------
# an H200's step at each of the grid's sizes (bf16, fused AdamW, the size's batch), estimated until the grid's files
# hold measured ones: 3.3M and 17M paced by the host as the 85M's 0.027 s is at a quarter of its work, 43M by its
# 8.5 TFLOP a step
GRID_STEP_S = {"3.3M": 0.012, "17M": 0.015, "43M": 0.035, "dry": 0.0}


def grid_cells(root: Path | None = None) -> list[tuple[scale.Cell, tuple[str, ...]]]:
    """The grid's blocks in the order they run: plain, the default and nudged plain in each cell, then primal
    averaging at each size's longest cell; ``root``: the dry run's one tiny cell on the CPU, in that folder (its
    default's blocks: primal averaging's take the same path, and the 85M's dry run rehearses its arm)."""
    if root is not None:
        return [(scale.Cell("dry", scale.SHARED_LENGTH, "dry", str(root)), scale.BLOCKS["default"])]
    cells = [scale.Cell(size, tokens, "gpu") for size, tokens in scale.GPU_GRID]
    longest = {c.size: c for c in sorted(cells, key=lambda c: c.tokens_per_param)}
    return [(c, scale.BLOCKS["default"]) for c in cells] + [(c, scale.BLOCKS["gpa_scaled"]) for c in longest.values()]


def grid_run_minutes(cell: scale.Cell) -> float:
    return (RUN_START_S + cell.length.steps * GRID_STEP_S[cell.size] * VALIDATION) / 60


def grid(call: Call) -> dict[str, Any]:
    """The grid's blocks in order while they fit the call (``scale.run_cell`` asks before the sweep and each
    block); what is complete and what waits for the next call. Each run is written to its block's file as it ends."""
    done, waiting, blocks = [], [], grid_cells(call.out / "grid" if call.dry else None)
    for cell, configs in blocks:
        minutes = grid_run_minutes(cell)
        fits = scale.run_cell(
            cell,
            tuple(range(cell.seeds)),
            configs,
            call.workdir,
            room=lambda runs, minutes=minutes: call.dry or runs * minutes * 60 < call.left(),
        )
        (done if fits else waiting).append(f"{cell.name} {'+'.join(configs)}")
    cells = list(dict.fromkeys(cell for cell, _ in blocks))
    return {"complete": done, "waiting": waiting, "table": scale.cells_table(cells)}


# -- the parts ------------------------------------------------------------------------------------------------------
def overheads(call: Call, cell: str) -> dict[str, Any]:
    """Plain Lightning and each mode of ``cell`` alternating in this process: the steady step's wall time over
    plain's, with a clock that synchronises only where its window starts and ends."""
    extra, modes = OVERHEAD_CELLS[cell]
    common = [*(TINY_GPT if call.dry else ["trainer=gpu"]), "model.warmup_steps=10"]  # plain too: bf16, the rate
    steps, rounds = (65, 1) if call.dry else (OVERHEAD_STEPS, OVERHEAD_ROUNDS)  # 65: a jump, judged
    chosen = {mode: OVERHEAD_MODES[mode] for mode in modes}
    return against_plain("tiny" if call.dry else "85M", steps, rounds, call.workdir, chosen, [*common, *extra])


def profile(call: Call) -> dict[str, Any]:
    """Each cycle's end and jump of the default, timed alone and counted, with its state on the device (by the fused
    kernels on a GPU, and eagerly) and on the host, and the GPU's busy share over 20 steps with a jump (dry: the
    GPT-2 shape at width 16, on the CPU)."""
    size = SMALL_GPT2 if call.dry else ["trainer=gpu"]
    steps = BUSY_START + BUSY_STEPS + 1 if call.dry else PROFILE_STEPS  # dry: the busy window, and no more
    out = {}
    arms = {"on_device": [], "eager": ["predictor.fused=false"], "on_host": ["predictor.state_on_host=true"]}
    if call.dry:
        del arms["eager"]  # on a CPU the jump on the device is the eager one
    for where, extra in arms.items():
        cfg = gpt_config("tiny" if call.dry else "85M", steps, call.workdir, [*size, *JUMPING, *extra])
        busy = BusyWindow(BUSY_START, BUSY_STEPS) if where == "on_device" else None
        out[where] = measure(cfg, busy, timed=not (call.dry and where != "on_device"))  # dry: the others counted
    return out


def quality(call: Call, record: dict[str, Any], save: Callable[[], None], rows: list[str]) -> dict[str, Any]:
    """The sweep's runs (plain, seed 0, each rate) and the comparisons at its best rate and a third of it, as the
    call's ``rows`` (``sweep``, ``quality``) ask; each run is saved as it ends, and carries over calls."""
    runs = record.setdefault("runs", {})
    steps = 8 if call.dry else QUALITY_STEPS

    def run(lr: float, seed: int, config: str) -> None:
        if _key(lr, seed, config) not in runs:
            cfg, started = call.config("char_gpt_gpt2", steps, [f"model.lr={lr}", *ARMS.get(config, [])], seed), now()
            runs[_key(lr, seed, config)] = fit(cfg, hybrid=config != "plain").to_dict() | stamp(started)
            save()

    if "sweep" in rows:
        for lr in SWEEP_RATES:
            run(lr, 0, "plain")
    best = best_rate(runs)
    if best is None:
        pending = []
    else:  # the rates whose runs are not all in, as many as this call has rows for, in the plan's order
        pending = [f for f in QUALITY_RATES if any(k not in runs for k in _quality_keys(best, f))]
        pending = pending[: rows.count("quality")]
    arms = {factor: ["default"] for factor in pending}
    if best is not None and "quality_gpa" in rows:
        arms.setdefault(1.0, []).append("gpa")  # after the default's runs at the best rate, if they run now
        arms = dict(sorted(arms.items(), reverse=True))
    for factor, names in arms.items():
        for seed in range(QUALITY_SEEDS):  # plain first in even seeds, last in odd, so that a run's place in the
            order = ("plain", *names) if seed % 2 == 0 else (*names, "plain")  # process (warm caches) favours neither
            for config in order:
                run(best * factor, seed, config)
    record["sweep"] = sweep_summary(runs)
    record["best_lr"] = best
    record["comparisons"] = comparisons(runs, best)
    return record


def sweep_summary(runs: dict[str, Any]) -> dict[str, Any]:
    """Plain's final and lowest validation loss at each rate that has run, and whether its curve turned up."""
    out = {}
    for lr in SWEEP_RATES:
        run = runs.get(_key(lr, 0, "plain"))
        if run is not None:
            losses = [p["val_loss"] for p in run["points"]]
            lowest = min(range(len(losses)), key=losses.__getitem__)
            out[f"{lr:.3g}"] = {
                "final": losses[-1],
                "lowest": losses[lowest],
                "lowest_step": run["points"][lowest].get("step"),
                "overfits": overfits(losses),
            }
    return out


def comparisons(runs: dict[str, Any], best: float | None) -> dict[str, Any]:
    """Per rate whose runs are all in: per seed, plain's over the default's backward passes and wall time to
    plain's final loss (``None`` where not reached; no figure where plain overfits), the loss at plain's last step
    over plain's final, the jumps made, kept and undone, plain's wall time for the whole run over the arm's (the
    machine's noise, where the arm's own cost is small) and the arm's peak device memory over plain's; medians over
    the seeds plain's final loss is a target in."""
    out = {}
    cells = [(factor, "default") for factor in QUALITY_RATES] + [(1.0, "gpa")]
    for factor, arm in cells if best is not None else ():
        if not all(k in runs for k in _quality_keys(best, factor, arm)):
            continue
        lr, seeds = best * factor, []
        for seed in range(QUALITY_SEEDS):
            plain, other = (record_from(runs[_key(lr, seed, c)]) for c in ("plain", arm))
            seeds.append(compare_seed(plain, other, plain.curve.points[-1].step))
        judged = [s for s in seeds if not s["overfitting"]]
        row: dict[str, Any] = {
            "arm": arm,
            "overfitting": [s["overfitting"] for s in seeds],
            "plain_rise": [s["plain_rise"] for s in seeds],
            "loss_equal_steps": [s["loss_ratio_equal_steps"] for s in seeds],
            "jumps": [_jumps(runs[_key(lr, s, arm)]) for s in range(QUALITY_SEEDS)],
            "whole_run_wall": [
                _whole_run_wall(runs[_key(lr, s, "plain")], runs[_key(lr, s, arm)]) for s in range(QUALITY_SEEDS)
            ],
            "peak_over_plain_bytes": [
                _peak_over_plain(runs[_key(lr, s, "plain")], runs[_key(lr, s, arm)]) for s in range(QUALITY_SEEDS)
            ],
        }
        for axis in ("backward", "wall_s"):
            row[f"{axis}_speedups"] = [s["to_target"][axis]["speedup"] for s in seeds]
            row[f"{axis}_median"] = (
                median_over_seeds([s["to_target"][axis]["speedup"] for s in judged]) if judged else None
            )
        out[f"lr{lr:.3g}" + ("" if arm == "default" else f"_{arm}")] = row
    return out


def _whole_run_wall(plain: dict[str, Any], arm: dict[str, Any]) -> float | None:
    """Plain's wall time to its last step over the arm's to the same step (``None``: the arm stopped short)."""
    end = plain["points"][-1]
    at = [p["wall_s"] for p in arm["points"] if p["step"] == end["step"]]
    return end["wall_s"] / at[0] if at else None


def _peak_over_plain(plain: dict[str, Any], arm: dict[str, Any]) -> int | None:
    """The arm's peak device memory over plain's (``None`` off a GPU, where neither is measured)."""
    peaks = plain["peak_cuda_allocated_bytes"], arm["peak_cuda_allocated_bytes"]
    return None if None in peaks else peaks[1] - peaks[0]


def _jumps(run: dict[str, Any]) -> dict[str, int]:
    return {"made": run["segments_started"], "kept": run["jumps_kept"], "undone": run["rollbacks"]}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1, default=str))


PARTS = ("grid", "overheads", "profile", "sweep", "quality", "quality_gpa", "overheads_adamw")  # the plan, in order
# what a call runs unless told: the grid, then what the first GPU run (2026-11-28) left: the busy share and AdamW
NEXT = ("grid", "profile", "overheads_adamw")
CHOICES = (*PARTS, *MECHANICS)
FILES = ("mechanics", "overheads", "profile", "quality", "grid")


def _unfinished(result: dict[str, Any] | None) -> bool:
    return not result or "error" in result


def _mechanics_due(parts: list[str], done: dict[str, Any] | None) -> list[str]:
    """The named mechanics parts not yet done: their minutes come out of the call's budget before the plan's."""
    record = (done or {}).get("mechanics") or {}
    return [p for p in parts if p in MECHANICS and _unfinished(record.get(p))]


def run(parts: list[str], out: Path, budget_min: float, dry: bool) -> dict[str, Any]:
    """The named mechanics parts, then the plan's rows this call has room for (every one, dry)."""
    out.mkdir(parents=True, exist_ok=True)
    done = {name: _load(out / f"{name}.json") for name in FILES}
    grid_root = out / "grid" if dry else None
    budget_rows = budget_min - sum(MECHANICS[p][1] for p in _mechanics_due(parts, done))
    rows = this_call([r for r in plan(done, GPA_ARM or dry, grid_root) if r[0] in parts], budget_rows, dry)
    with tempfile.TemporaryDirectory() as workdir:
        call = Call(out, dry, time.monotonic() + budget_min * 60, workdir)
        for part in (p for p in parts if p in MECHANICS):
            if _mechanics(part, call, done):
                _write(out / "mechanics.json", done["mechanics"] | {"machine": machine()})
                write_atomic(out / "README.md", markdown(done))
        for part in dict.fromkeys(row[0] for row in rows):
            if part == "grid":
                done["grid"] = _attempt(grid, call) | {"machine": machine()}
                _write(out / "grid.json", done["grid"])
            elif part in ("overheads", "overheads_adamw"):
                cell = "85M" if part == "overheads" else "85M_adamw"
                cells = done["overheads"].setdefault("cells", {})
                cells[cell] = _attempt(lambda c, cell=cell: overheads(c, cell), call)
                _write(out / "overheads.json", done["overheads"] | {"machine": machine()})
            elif part == "profile":
                done["profile"] = {"result": _attempt(profile, call), "machine": machine()}
                _write(out / "profile.json", done["profile"])
            elif part == "sweep" or (
                part.startswith("quality") and "sweep" not in (row[0] for row in rows)
            ):  # the sweep's runs and the quality's
                record = done["quality"]

                def save(record: dict[str, Any] = record) -> None:
                    _write(out / "quality.json", record | {"machine": machine()})

                try:
                    done["quality"] = quality(call, record, save, [row[0] for row in rows])
                except Exception:  # the part's error is its result; the runs so far stay in the file
                    done["quality"] = record | {"error": traceback.format_exc()[-3000:]}
                save(done["quality"])
            write_atomic(out / "README.md", markdown(done))
    return done


def _mechanics(part: str, call: Call, done: dict[str, Any]) -> bool:
    """Run or skip a named mechanics part not yet done; whether its record changed."""
    fn, minutes, cpu_reason = MECHANICS[part]
    if not _unfinished(done["mechanics"].get(part)):
        return False
    on_cpu = (call.dry or not CUDA) and cpu_reason is not None
    if on_cpu or (part == "fsdp" and torch.cuda.device_count() < 2):
        count = torch.cuda.device_count()
        done["mechanics"][part] = {"skipped": cpu_reason if on_cpu else f"needs two GPUs, found {count}"}
    elif call.left() < minutes * 60 and not call.dry:
        print(f"{part}: deferred to the next call ({minutes} min needed)", flush=True)
        return False
    else:
        done["mechanics"][part] = _attempt(fn, call)
    return True


def _attempt(fn: Callable[[Call], dict[str, Any]], call: Call) -> dict[str, Any]:
    try:
        return fn(call)
    except Exception:  # recorded, and the other parts still run
        return {"error": traceback.format_exc()[-3000:]}


# what a busy share above 100% (recorded by 2026-11-28's run) says of itself
OVERCOUNTED = (
    "the sum counted the profiler's GPU annotations (the optimizer's step, say) besides the kernels they hold; "
    "counted since without them, not measured again."
)


def markdown(done: dict[str, Any]) -> str:
    """The results so far, as tables a reader can check against the JSON files beside them."""
    recorded = [done[name]["machine"] for name in FILES if "machine" in done[name]]
    where = recorded[0] if recorded else machine()  # the GPU's, when the results are read back elsewhere
    lines = ["# The GPU command (`python -m benchmarks.gpu`)", "", f"Machine: {where}", ""]
    if "table" in done["grid"]:
        lines += ["## The grid (`benchmarks.scale`'s GPU cells), as this call left it", "", done["grid"]["table"], ""]
        lines += [f"Waiting for a later call: {', '.join(done['grid']['waiting']) or 'none'}.", ""]
    cells = done["overheads"].get("cells", {})
    if cells:
        lines += ["## Overheads: the steady step's wall time over plain's (median, range over rounds)", ""]
        lines += ["| cell | mode | step over plain | jumps made a run |", "|---|---|---|---|"]
        for cell, result in cells.items():
            if "error" in result:
                lines.append(f"| {cell} | error | {_short(result)} | |")
                continue
            for mode, ratios in result["steady_ratios"].items():
                jumps = sorted({k["jumps"] for k in result["kept"][mode]})
                lines.append(f"| {cell} | {mode} | {seeds_cell(ratios, '.3f')} | {jumps} |")
        lines.append("")
    profiled = done["profile"].get("result")
    if profiled:
        lines += ["## Profile: each cycle's end and jump alone (synchronised), medians", ""]
        if "error" in profiled:
            lines.append(_short(profiled))
        else:
            head = "| state | cycle end ms (max) | jump ms (max) | ops: cycle end, jump | host reads: cycle end, jump |"
            lines += [head, "|---|---|---|---|---|"]
            for where_, m in profiled.items():
                end, jump = m["cycle_end"], m["jump"]
                lines.append(
                    f"| {where_} | {end.get('ms', 0):.1f} ({end.get('ms_max', 0):.1f}) | {jump.get('ms', 0):.1f} "
                    f"({jump.get('ms_max', 0):.1f}) | {end.get('ops')}, {jump.get('ops')} | {end.get('host_reads')},"
                    f" {jump.get('host_reads')} |"
                )
            busy = profiled["on_device"].get("busy") or {}
            if busy:
                share = f"{busy['busy_share']:.0%} ({busy['device_busy_s']:.3f} s of {busy['wall_s']:.3f} s)"
                counts = f"{busy['kernel_launches']} kernel launches, {busy['host_synchronisations']} host syncs"
                lines += ["", f"The device's busy share over {busy['steps']} steps with a jump: {share}; {counts}."]
                if busy["busy_share"] > 1:  # no share can pass 100%: the sum counted more than the kernels
                    lines[-1] += f" Not a share: {OVERCOUNTED}"
        lines.append("")
    runs = done["quality"].get("runs", {})
    swept, compared = sweep_table(runs), comparison_tables(runs)
    if swept:
        lines += [f"## Sweep: plain, {QUALITY_STEPS:,} steps, seed 0", "", *swept, ""]
    if compared:
        title = "## Quality: plain's over the arm's to plain's final loss (>1: the arm sooner), medians (range)"
        lines += [title, "", *compared, ""]
    mechanics = {k: v for k, v in done["mechanics"].items() if k != "machine"}
    if mechanics:
        lines += ["## Mechanics", "", "| part | result |", "|---|---|"]
        lines += [f"| {part} | {_short(result)} |" for part, result in mechanics.items()]
    return "\n".join(lines) + "\n"


def sweep_table(runs: dict[str, Any]) -> list[str]:
    """Plain's curve at each swept rate: its final and lowest validation loss and the step of the lowest."""
    sweep = sweep_summary(runs)
    lines = ["| lr | final val loss | lowest (at step) | turns up at its end |", "|---|---|---|---|"]
    for lr, row in sweep.items():
        turns = "yes: no target" if row["overfits"] else "no"
        lines.append(f"| {lr} | {row['final']:.4f} | {row['lowest']:.4f} ({row['lowest_step']}) | {turns} |")
    return lines if sweep else []


def comparison_tables(runs: dict[str, Any]) -> list[str]:
    """Each arm against plain: medians (range) over seeds, then each seed with its jumps."""
    compared = comparisons(runs, best_rate(runs))
    if not compared:
        return []
    lines = [
        "| lr | arm | backward passes | wall time | loss at equal steps, arm/plain | plain's wall for the whole run"
        " over the arm's | plain overfits |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in compared.items():
        lines.append(
            f"| {key.split('_')[0]} | {row['arm']} | {seeds_cell(row['backward_speedups'])} | "
            f"{seeds_cell(row['wall_s_speedups'])} | {seeds_cell(row['loss_equal_steps'], '.3f', '')} | "
            f"{seeds_cell(row['whole_run_wall'], '.3f', '')} | {sum(row['overfitting'])} of {len(row['overfitting'])} |"
        )
    lines += ["", "| lr | arm | seed | backward passes | wall time | loss at equal steps | jumps made, kept, undone |"]
    lines.append("|---|---|---|---|---|---|---|")
    for key, row in compared.items():
        for seed, jumps in enumerate(row["jumps"]):
            figures = [row["backward_speedups"][seed], row["wall_s_speedups"][seed]]
            reached = [f"{f:.3f}x" if f is not None else "not reached" for f in figures]
            lines.append(
                f"| {key.split('_')[0]} | {row['arm']} | {seed} | {' | '.join(reached)} | "
                f"{row['loss_equal_steps'][seed]:.3f} | {jumps['made']}, {jumps['kept']}, {jumps['undone']} |"
            )
    return lines


def _short(result: dict[str, Any]) -> str:
    keys = ("error", "skipped", "passed", "flat", "growth_within_each_phase", "hybrid_over_plain")
    picked = {k: result[k] for k in keys if k in result} or result
    return json.dumps(picked, default=str)[:400].replace("|", "/")


def plan_text(
    parts: list[str], budget_min: float, dry: bool = False, done: dict[str, Any] | None = None, out: Path | None = None
) -> str:
    rows = [r for r in plan(done, GPA_ARM or dry, out / "grid" if dry and out else None) if r[0] in parts]
    named = _mechanics_due(parts, done)
    now = this_call(rows, budget_min - sum(MECHANICS[p][1] for p in named), dry)
    lines = [
        f"plan ({'dry run, tiny sizes' if dry else 'estimated minutes on an H200'}; this call: the first {len(now)}):"
    ]
    lines += [f"  {part:15s} {what:62s} ~{minutes:.1f} min" for part, what, minutes in rows]
    lines += [f"  {p:15s} (named) ~{MECHANICS[p][1]:.1f} min" for p in named]
    total = sum(r[2] for r in now) + sum(MECHANICS[p][1] for p in named)
    return "\n".join([*lines, f"  this call ~{total:.1f} min"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=CHOICES, default=list(NEXT))
    parser.add_argument("--budget-min", type=float, default=BUDGET_MIN, help="minutes this call's parts may use")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU; the CUDA-only parts skipped")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/gpu/<date>")
    parser.add_argument("--report", action="store_true", help="rewrite --out's README.md from its files; run nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    out = args.out or RESULTS / "gpu" / datetime.date.today().isoformat()
    done = {name: _load(out / f"{name}.json") for name in FILES}
    if args.report:
        write_atomic(out / "README.md", markdown(done))
        return
    print(plan_text(args.parts, args.budget_min, args.dry_run, done, out), flush=True)  # before anything runs
    done = run(args.parts, out, args.budget_min, args.dry_run)
    print(markdown(done))


if __name__ == "__main__":
    main()
