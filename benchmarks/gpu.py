"""The GPU command, for the session that is lent a GPU: one call measures what only a GPU can show, prints its plan
and estimated minutes first, writes each part as soon as it ends, and a later call resumes from those results.

    python -m benchmarks.gpu                       # the call's work: overheads, then quality (about 9 minutes)
    python -m benchmarks.gpu --parts sync memory   # the earlier mechanics checks, by name
    python -m benchmarks.gpu --dry-run             # on the CPU at tiny sizes: the suite runs it so it cannot rot

``overheads``: plain Lightning and the default stepping aside, jumping every cycle, and the per-step mode backed off,
alternating in this process over 5 rounds, on a 25M and the 85M GPT-2-shaped character GPT in bf16 with fused
AdamW: the steady step's wall time over plain's, timed with a clock that synchronises only where its window starts
and ends (the host runs ahead of the device, as in a user's run). Stepping aside is also the cost of the steps
between jumps; jumping minus stepping aside is a jump's cost amortised over its cycle.
``quality``: the 85M task, 1,000 steps, the cosine schedule decaying over the run, plain and the default
alternating over 3 seeds, at the tuned rate and, where the plan has room, a third of it: wall time and backward
passes to plain's final validation loss.
The mechanics parts (``sync``, ``memory``, ``offload``, ``outer_memory``, ``fp16``, ``fsdp``) run when named.
Results: ``overheads.json``, ``quality.json``, ``mechanics.json`` and ``README.md`` in ``--out`` (default
``benchmarks/results/gpu/<date>``). A part that fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import open_dict

from benchmarks.harness import (
    HYBRID,
    RESULTS,
    SIZES,
    against_plain,
    compare_seed,
    fit,
    machine,
    record_from,
    write_atomic,
)
from benchmarks.tasks import Length, compose_run

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
TINY_GPT = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "data.block_size=32", "data.max_bytes=20000"]
PREDICTING = ["predictor=linear", "hybrid.warmup_steps=20", "hybrid.full_steps=10", "hybrid.confidence_threshold=0.0"]
PREDICTING += ["hybrid.predict_lr_fraction=1.0", "hybrid.max_consecutive_rollbacks=1000"]
PREDICTING += ["hybrid.bandit=false", "hybrid.backoff_after=0"]  # keep predicting: these parts measure its mechanics
MID = SIZES["25M"]  # 25M parameters


@dataclass
class Call:
    """One call of the command: where results go, how small the runs are, and the time it may take."""

    out: Path
    dry: bool
    deadline: float  # time.monotonic() at which this call stops starting work
    workdir: str

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def config(self, task: str, steps: int, overrides: list[str], seed: int = 0, val_every: int | None = None) -> Any:
        """A harness run's config: on the GPU in bf16 (``trainer=gpu``), on the CPU at a tiny size (dry run)."""
        size = TINY_GPT if self.dry else ["trainer=gpu"]
        length = Length(steps, val_every or max(1, steps // 10), 2 if self.dry else 10, f"{steps}steps")
        return compose_run(task, length, seed, [*size, *overrides], self.workdir)


def _summary(cfg: Any, callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Fit ``cfg`` (hybrid) with ``VRAMLogger``; return the hybrid summary and the peak GPU memory."""
    from lightning_hybrid.callbacks import VRAMLogger, find_scheduler
    from lightning_hybrid.runner import build_run

    trainer, model, data, _ = build_run(
        cfg, hybrid=True, extra_callbacks=[VRAMLogger(every_n_steps=50), *(callbacks or [])]
    )
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(model, data)
    summary = find_scheduler(trainer).summary(trainer)
    summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated() if CUDA else None
    return summary


# ----------------------------------------------------------------------------------------------------- the parts


def sync(call: Call) -> dict[str, Any]:
    """The suite's CUDA tests: 40 steps under ``torch.cuda.set_sync_debug_mode("error")``, quiet steps read nothing;
    ``outer``'s jumps with ``state_on_host`` (pinned memory, a side stream) the same as without; and ``linear``'s
    update average on the host between fits, back on the device in the next."""
    tests = ["tests/test_idle.py::test_quiet_steps_never_synchronise_on_cuda"]
    tests += ["tests/test_outer_on_host.py::test_jumps_with_state_on_host_match_jumps_without_on_every_device"]
    tests += ["tests/test_lightning_run.py::test_the_update_average_waits_on_the_host_between_fits_on_cuda"]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "--tb=short", *tests]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    return {"passed": done.returncode == 0, "output": done.stdout[-6000:]}


def memory(call: Call) -> dict[str, Any]:
    """Peak memory per phase of a predicting run (25M parameters), and the memory in use along 2,000 steps that
    keep predicting: the system this descends from grew from 3.9 to 14.1 GB in 50. Memory in use differs by phase
    (a segment holds its snapshot), so growth is read within each phase, from its first sample after the first
    tenth of the run to its last."""
    from lightning.pytorch.callbacks import Callback

    from lightning_hybrid.callbacks import find_scheduler

    steps = 40 if call.dry else 2000
    samples: list[tuple[int, str, int]] = []

    class Watch(Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step % max(1, steps // 40) == 0:
                used = torch.cuda.memory_allocated() if CUDA else 0
                samples.append((trainer.global_step, find_scheduler(trainer).phase.name.lower(), used))

    cfg = call.config("char_gpt", steps, [*([] if call.dry else MID), *PREDICTING])
    summary = _summary(cfg, [Watch()])
    growth: dict[str, float] = {}
    for phase in {phase for _, phase, _ in samples}:
        used = [u for step, p, u in samples if p == phase and step >= steps // 10]
        if len(used) >= 2 and CUDA:
            growth[phase] = (used[-1] - used[0]) / max(used[0], 1)
    return {
        "steps": steps,
        "memory_peak_bytes_by_phase": summary.get("memory_peak_bytes_by_phase"),
        "allocated_along_the_run": samples,
        "growth_within_each_phase": growth,
        "predicted_steps": summary["steps_by_phase"]["predict"],
        "flat": bool(growth) and max(growth.values()) < 0.01,
    }


def offload(call: Call) -> dict[str, Any]:
    """The peak memory of the Predict phase with ``predict_memory`` none, offload and aggressive (25M parameters)."""
    out = {}
    for mode in ("none", "offload", "aggressive"):
        cfg = call.config("char_gpt", 40 if call.dry else 200, [*([] if call.dry else MID), *PREDICTING])
        with open_dict(cfg):
            cfg.hybrid.predict_memory = mode
        summary = _summary(cfg)
        out[mode] = {"predict_peak_bytes": (summary.get("memory_peak_bytes_by_phase") or {}).get("predict")}
    return out


OUTER_CYCLES = ["hybrid.warmup_steps=20", "hybrid.full_steps=20"]
OUTER_ON_DEVICE = [*HYBRID["outer_norm_restart"], "predictor.state_on_host=false"]
OUTER_ON_HOST = [*HYBRID["outer_norm_restart"], "predictor.state_on_host=true"]


def outer_memory(call: Call) -> dict[str, Any]:
    """Device memory between cycle ends, in parameter copies above plain's (25M parameters, 120 steps): the median
    of the bytes allocated after each step of the run's second half. ``outer_norm_restart`` holds the anchor, ``b``
    and the last jump (3 by construction); with ``state_on_host``, the anchor alone (1). Also each run's peak, and
    what is still allocated after ``fit`` (Lightning moves the model and the optimizer off the device at teardown;
    the rule's state goes to the host too). Each figure is above what was allocated as the run began."""
    from lightning.pytorch.callbacks import Callback

    from lightning_hybrid.callbacks import find_scheduler
    from lightning_hybrid.runner import build_run

    steps, cycles = (40, ["hybrid.warmup_steps=5", "hybrid.full_steps=10"]) if call.dry else (120, OUTER_CYCLES)
    runs = {"plain": None, "outer_norm_restart": OUTER_ON_DEVICE, "state_on_host": OUTER_ON_HOST}
    out: dict[str, Any] = {}

    class Watch(Callback):
        def __init__(self) -> None:
            self.after_step: list[int] = []

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step > steps // 2 and CUDA:
                self.after_step.append(torch.cuda.memory_allocated())

    for label, overrides in runs.items():
        gc.collect()  # the last run's trainer is a reference cycle: what it still held must not count here
        start = torch.cuda.memory_allocated() if CUDA else 0
        watch = Watch()
        cfg = call.config("char_gpt", steps, [*([] if call.dry else MID), *(overrides or []), *cycles])
        trainer, model, data, _ = build_run(cfg, hybrid=overrides is not None, extra_callbacks=[watch])
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        trainer.fit(model, data)
        copy = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        out[label] = {
            "between_steps_bytes": statistics.median(watch.after_step) - start if watch.after_step else None,
            "peak_bytes": torch.cuda.max_memory_allocated() - start if CUDA else None,
            "after_fit_bytes": torch.cuda.memory_allocated() - start if CUDA else None,  # the trainer still alive
            "parameter_copy_bytes": copy,
            "jumps_made": find_scheduler(trainer).summary(trainer)["jumps_made"] if overrides else None,
        }
    plain = out["plain"]["between_steps_bytes"]
    for label in ("outer_norm_restart", "state_on_host"):
        held = out[label]["between_steps_bytes"]
        out[label]["copies_above_plain"] = (held - plain) / out[label]["parameter_copy_bytes"] if plain else None
    return out


def fp16(call: Call) -> dict[str, Any]:
    """``16-mixed`` with its GradScaler, predicting at full rate so that segments are rolled back."""
    cfg = call.config("char_gpt", 300, [*MID, *PREDICTING, "hybrid=aggressive", "trainer.precision=16-mixed"])
    summary = _summary(cfg)
    return {k: summary[k] for k in ("steps_by_phase", "rollbacks", "nonfinite_steps_skipped", "segments_started")}


def fsdp(call: Call) -> dict[str, Any]:
    """``hybrid_fsdp`` over two GPUs on NCCL, through the app: it trains, predicts and ranks agree."""
    args = ["experiment=char_gpt", "trainer=gpu", "trainer.strategy=hybrid_fsdp", "trainer.devices=2"]
    args += ["trainer.max_steps=100"]
    args += [*MID, *PREDICTING, "callbacks=none", f"paths.output_dir={call.workdir}/fsdp"]
    done = subprocess.run(
        [sys.executable, "-m", "lightning_hybrid.train", *args], cwd=ROOT, capture_output=True, text=True
    )
    return {"passed": done.returncode == 0, "output": (done.stdout + done.stderr)[-2000:]}


# -- the two parts: the plugin's cost a step, and time to plain's quality, on the 85M task -------------------------
# the modes against plain (bf16, the default rule's cycles of 20 steps: the task's warmup of 100 would fill the run)
CYCLES_OF_20 = ["hybrid.warmup_steps=20", "hybrid.full_steps=20"]
JUMPING = ["predictor=outer", "predictor.verify_resolution=0", *CYCLES_OF_20]  # a jump every cycle
OVERHEAD_MODES = {
    "default_aside": ["predictor=outer", "predictor.verify_resolution=1e-12", *CYCLES_OF_20],  # no cycle judged
    "default_jumping": JUMPING,
    # the same with the rule's state on the device (state_on_host is the default on CUDA): what the copies cost
    "default_jumping_on_device": [*JUMPING, "predictor.state_on_host=false"],
    "per_step_backed_off": ["predictor=linear", "hybrid.enable_prediction=false"],
}
# cell -> (size, overrides of every run, plain's included, modes): fused AdamW (the demo's default on a GPU), then
# torch's default AdamW, which a user gets by default and where every quiet step reads the guard to the host
OVERHEAD_CELLS = {
    "85M": ("85M", [], tuple(OVERHEAD_MODES)),
    "85M_adamw": ("85M", ["model.fused=false"], ("default_aside", "default_jumping")),
}
OVERHEAD_ROUNDS, OVERHEAD_STEPS = 5, 200  # 200: eight jumps, at steps 60, 80, ...
# The 85M task's rate: plain's better final loss of the two measured at 1,000 steps, cosine, on an H200
# (2026-11-27: 6e-4 beat the 200-step sweep's 1.8e-3 in every seed); then a third of it, where the plan has room.
QUALITY_LR, QUALITY_STEPS, QUALITY_SEEDS = 6e-4, 1000, 3
QUALITY_RATES = (1.0, 1 / 3)
# an H200's bf16 step, in seconds, and the seconds of each run's start (model, data, Trainer) and the share that
# validation adds, as measured on 2026-11-27 (the whole first call: 5.8 minutes): what the plan is estimated from
STEP_S = {"85M": 0.027}
RUN_START_S, QUALITY_VALIDATION = 1.5, 1.2
BUDGET_MIN = 9.0  # the two parts' share of one device call (10 minutes at most)


def _overhead_minutes(cell: str) -> float:
    size, _, modes = OVERHEAD_CELLS[cell]
    return OVERHEAD_ROUNDS * (1 + len(modes)) * (RUN_START_S + OVERHEAD_STEPS * STEP_S[size]) / 60


QUALITY_MINUTES = 2 * QUALITY_SEEDS * (RUN_START_S + QUALITY_STEPS * STEP_S["85M"] * QUALITY_VALIDATION) / 60


def _rate_done(runs: dict[str, Any], factor: float) -> bool:
    lr = QUALITY_LR * factor
    return all(f"lr{lr:.3g}_seed{s}_{c}" in runs for s in range(QUALITY_SEEDS) for c in ("plain", "default"))


def _complete(runs: dict[str, Any]) -> bool:
    """Whether ``runs`` hold every planned rate (a record completed under another rate plan may not)."""
    return all(_rate_done(runs, factor) for factor in QUALITY_RATES)


def quality_rates(dry: bool = False, done: dict[str, Any] | None = None) -> list[float]:
    """The quality part's rates this call runs (factors of ``QUALITY_LR``), in order, while the call's estimate
    stays within ``BUDGET_MIN`` (every one in a dry run): what ``done`` (the results so far) holds costs nothing,
    so a second call runs the rates the first had no room for."""
    done = done or {}
    runs = done.get("quality", {}).get("runs", {})
    minutes = 0.0 if done.get("overheads", {}).get("result") else sum(map(_overhead_minutes, OVERHEAD_CELLS))
    rates = []
    for factor in QUALITY_RATES:
        cost = 0.0 if _rate_done(runs, factor) else QUALITY_MINUTES
        if rates and minutes + cost > BUDGET_MIN and not dry:
            break
        rates.append(factor)
        minutes += cost
    return rates


def plan(dry: bool = False, done: dict[str, Any] | None = None) -> list[tuple[str, str, float]]:
    """What a call runs, in order, with its estimated minutes on an H200: ``(part, what, minutes)``."""
    rows = []
    for cell, (_, _, modes) in OVERHEAD_CELLS.items():
        what = f"{cell}: plain and {len(modes)} modes, {OVERHEAD_ROUNDS} rounds"
        rows.append(("overheads", what, _overhead_minutes(cell)))
    if (done or {}).get("overheads", {}).get("result"):
        rows = []
    runs = (done or {}).get("quality", {}).get("runs", {})
    for factor in quality_rates(dry, done):
        if _rate_done(runs, factor):
            continue
        what = f"85M at {QUALITY_LR * factor:.3g}: plain and the default, {QUALITY_SEEDS} seeds"
        rows.append(("quality", what, QUALITY_MINUTES))
    return rows


def overheads(call: Call) -> dict[str, Any]:
    """Plain Lightning and each mode alternating in this process, ``OVERHEAD_ROUNDS`` rounds, per cell: the steady
    step's wall time over plain's, with a clock that synchronises only where its window starts and ends."""
    common = TINY_GPT if call.dry else ["trainer=gpu"]  # bf16, plain's runs too
    steps, rounds = (65, 1) if call.dry else (OVERHEAD_STEPS, OVERHEAD_ROUNDS)  # 65: a jump, judged
    out = {}
    for cell, (size, extra, modes) in OVERHEAD_CELLS.items():
        chosen = {mode: OVERHEAD_MODES[mode] for mode in modes}
        out[cell] = against_plain("1M" if call.dry else size, steps, rounds, call.workdir, chosen, [*common, *extra])
    return out


def quality(call: Call, record: dict[str, Any], save: Callable[[], None], rates: list[float]) -> dict[str, Any]:
    """Plain against the defaults on the 85M task, ``QUALITY_STEPS`` steps with the cosine schedule decaying over
    the run, seeds alternating: wall time and backward passes to plain's final validation loss. Runs carry over
    calls."""
    runs = record.setdefault("runs", {})
    steps = 8 if call.dry else QUALITY_STEPS
    for factor in rates:
        lr = QUALITY_LR * factor
        for seed in range(QUALITY_SEEDS):
            for config in ("plain", "default"):
                key = f"lr{lr:.3g}_seed{seed}_{config}"
                if key not in runs:
                    cfg = call.config("char_gpt_gpt2", steps, [f"model.lr={lr}"], seed)
                    runs[key] = fit(cfg, hybrid=config == "default").to_dict()
                    save()
    record["comparisons"] = _comparisons(runs, [f for f in QUALITY_RATES if _rate_done(runs, f)])
    return record | {"complete": _complete(runs)}


def _comparisons(runs: dict[str, Any], rates: list[float]) -> dict[str, Any]:
    """Per rate: speedups to plain's final loss in backward passes and wall seconds (None where not reached), and
    the loss at plain's last evaluation over plain's."""
    out = {}
    for factor in rates:
        lr = QUALITY_LR * factor
        seeds = []
        for seed in range(QUALITY_SEEDS):
            plain, other = (record_from(runs[f"lr{lr:.3g}_seed{seed}_{c}"]) for c in ("plain", "default"))
            seeds.append(compare_seed(plain, other, plain.curve.points[-1].step))
        row: dict[str, Any] = {"loss_equal_steps": [s["loss_ratio_equal_steps"] for s in seeds]}
        for axis in ("backward", "wall_s"):
            speedups = [s["to_target"][axis]["speedup"] for s in seeds]
            row[f"{axis}_speedups"] = speedups
            row[f"{axis}_median"] = statistics.median(v if v is not None else 0.0 for v in speedups)
        out[f"lr{lr:.3g}"] = row
    return out


MECHANICS: dict[str, tuple[Callable[[Call], dict[str, Any]], float, str | None]] = {
    # name -> (what it runs, minutes it takes on a GPU, why it cannot run on the CPU)
    "sync": (sync, 1.0, "needs CUDA: torch.cuda.set_sync_debug_mode"),
    "memory": (memory, 3.0, None),
    "offload": (offload, 1.5, None),
    "outer_memory": (outer_memory, 1.5, None),
    "fp16": (fp16, 1.0, "needs CUDA: 16-mixed and its GradScaler"),
    "fsdp": (fsdp, 2.0, "needs two CUDA devices and NCCL"),
}
PARTS = ("overheads", "quality")  # the call's work; the mechanics parts run when named
CHOICES = (*PARTS, *MECHANICS)


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1, default=str))


def run(parts: list[str], out: Path, budget_min: float, dry: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    mechanics, overheads_file, quality_file = out / "mechanics.json", out / "overheads.json", out / "quality.json"
    done = {"mechanics": _load(mechanics), "overheads": _load(overheads_file), "quality": _load(quality_file)}
    rates = quality_rates(dry, done)
    with tempfile.TemporaryDirectory() as workdir:
        call = Call(out, dry, time.monotonic() + budget_min * 60, workdir)
        for part in parts:
            if part in MECHANICS:
                fn, minutes, cpu_reason = MECHANICS[part]
                if part in done["mechanics"] and "error" not in done["mechanics"][part]:
                    continue
                on_cpu = (dry or not CUDA) and cpu_reason is not None
                if on_cpu or (part == "fsdp" and torch.cuda.device_count() < 2):
                    count = torch.cuda.device_count()
                    done["mechanics"][part] = {"skipped": cpu_reason if on_cpu else f"needs two GPUs, found {count}"}
                elif call.left() < minutes * 60 and not dry:
                    print(f"{part}: deferred to the next call ({minutes} min needed)", flush=True)
                    continue
                else:
                    done["mechanics"][part] = _attempt(fn, call)
                _write(mechanics, done["mechanics"] | {"machine": machine()})
            elif part == "overheads" and not done["overheads"].get("result"):
                done["overheads"] = {"result": _attempt(overheads, call), "machine": machine()}
                _write(overheads_file, done["overheads"])
            elif part == "quality" and not _complete(done["quality"].get("runs", {})):
                record = done["quality"]

                def save(record: dict[str, Any] = record) -> None:
                    _write(quality_file, record | {"machine": machine()})

                try:
                    done["quality"] = quality(call, record, save, rates)
                except Exception:  # the part's error is its result; the runs so far stay in the file
                    done["quality"] = record | {"error": traceback.format_exc()[-3000:]}
                _write(quality_file, done["quality"] | {"machine": machine()})
            write_atomic(out / "README.md", markdown(done))
    return done


def _attempt(fn: Callable[[Call], dict[str, Any]], call: Call) -> dict[str, Any]:
    try:
        return fn(call)
    except Exception:  # recorded, and the other parts still run
        return {"error": traceback.format_exc()[-3000:]}


def markdown(done: dict[str, Any]) -> str:
    recorded = [d["machine"] for d in (done["quality"], done["overheads"], done["mechanics"]) if "machine" in d]
    where = recorded[0] if recorded else machine()  # the GPU's, when the results are read back elsewhere
    lines = ["# The GPU proof (`python -m benchmarks.gpu`)", "", f"Machine: {where}", "", "| part | result |"]
    lines.append("|---|---|")
    for part, result in done["mechanics"].items():
        if part != "machine":
            lines.append(f"| {part} | {_short(result)} |")
    lines.append(f"| overheads | {_short(done['overheads'].get('result', {'not run': True}))} |")
    quality_done = done["quality"]
    summary = quality_done.get("comparisons") or {"runs so far": len(quality_done.get("runs", {}))}
    lines.append(f"| quality | {_short(summary)} |")
    return "\n".join(lines) + "\n"


def _short(result: dict[str, Any]) -> str:
    keys = ("error", "skipped", "passed", "flat", "growth_within_each_phase", "hybrid_over_plain")
    picked = {k: result[k] for k in keys if k in result} or result
    return json.dumps(picked, default=str)[:400].replace("|", "/")


def plan_text(parts: list[str], dry: bool = False, done: dict[str, Any] | None = None) -> str:
    rows = [r for r in plan(dry, done) if r[0] in parts]
    lines = [f"plan ({'dry run, tiny sizes' if dry else 'estimated minutes on an H200'}):"]
    lines += [f"  {part:9s} {what:55s} ~{minutes:.1f} min" for part, what, minutes in rows]
    named = [p for p in parts if p in MECHANICS]
    lines += [f"  {p:9s} (named) ~{MECHANICS[p][1]:.1f} min" for p in named]
    total = sum(r[2] for r in rows) + sum(MECHANICS[p][1] for p in named)
    return "\n".join([*lines, f"  total ~{total:.1f} min"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=CHOICES, default=list(PARTS))
    parser.add_argument("--budget-min", type=float, default=BUDGET_MIN, help="minutes the mechanics parts may use")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU; the CUDA-only parts skipped")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/gpu/<date>")
    args = parser.parse_args(argv)
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    out = args.out or RESULTS / "gpu" / datetime.date.today().isoformat()
    done = {name: _load(out / f"{name}.json") for name in ("overheads", "quality")}
    print(plan_text(args.parts, args.dry_run, done), flush=True)  # before anything runs: what the call will do
    done = run(args.parts, out, args.budget_min, args.dry_run)
    print(markdown(done))


if __name__ == "__main__":
    main()
