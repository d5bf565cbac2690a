"""The GPU proof as one command, for the session that is lent a GPU: everything only a GPU can show, part by part,
each written as soon as it ends, and resumed from its own results by the next call.

    python -m benchmarks.gpu                       # every part not done yet, within 7 minutes of this call
    python -m benchmarks.gpu --parts sync memory   # only these
    python -m benchmarks.gpu --budget-min 4        # a shorter call
    python -m benchmarks.gpu --dry-run             # on the CPU, every part at a tiny size (the CUDA-only checks
                                                   # skipped by name): the suite runs this so the command cannot rot

Parts, cheap and decisive first: ``sync`` (quiet steps never synchronise, under ``set_sync_debug_mode("error")``;
``outer``'s jumps with ``state_on_host`` match those without, through pinned memory and a side stream; a
per-step predictor's update average waits on the host between fits),
``memory`` (peak and steady memory per phase; memory flat over 2,000 predicting steps), ``offload`` (what
``predict_memory`` frees during Predict), ``outer_memory`` (device memory between cycle ends of ``outer``, with
and without ``state_on_host``, in parameter copies above plain), ``fp16`` (``16-mixed``: the GradScaler with
rollbacks), ``fsdp`` (``hybrid_fsdp`` on NCCL, where two GPUs are present), ``overheads`` (prediction off, tracking
and ``outer``, with and without ``state_on_host``, against plain, in one process), and ``gpt2`` (the
GPT-2-small-shaped task in bf16 with fused AdamW: plain against the defaults (``outer`` with its guards, its state
in host memory as on every CUDA run), at the task's rate, a third of it and 3 times it, 3 seeds, and plain
alone at a ninth and 9 times it; its length is planned from two probe runs to fit the call and printed first, and
its runs carry over calls).
Results: ``mechanics.json``, ``overheads.json``, ``gpt2.json`` and ``README.md`` in ``--out`` (default
``benchmarks/results/gpu/<date>``; four files, within what the device tool brings back).
A part that fails is recorded with its error; the others still run.
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
    IDLE_MODES,
    RESULTS,
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
MID = ["model.n_layer=8", "model.n_embd=512", "model.n_head=8", "data.batch_size=8"]  # 25M parameters


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


def overheads(call: Call) -> dict[str, Any]:
    """Hybrid runs that never predict, and ``outer``, against plain Lightning, alternating in this process."""
    size, steps, rounds = ("1M", 10, 1) if call.dry else ("25M", 200, 3)
    outer = {"outer": [*OUTER_ON_DEVICE, *OUTER_CYCLES], "outer_on_host": [*OUTER_ON_HOST, *OUTER_CYCLES]}
    modes = {**IDLE_MODES, **outer}
    return against_plain(size, steps, rounds, call.workdir, modes)


# the default (the harness's `outer_norm_restart_res`), its state in host memory as on every CUDA run
GPT2_CONFIGS = {"defaults": []}
GPT2_SEEDS = 3
# (the rate over the task's, whether the configurations run beside plain), in the order they run: the two
# rates first, then plain alone (seed 0) at the sweep's ends, which says whether the task's rate is the tuned one
GPT2_CELLS = ((1.0, True), (1 / 3, True), (1 / 9, False), (9.0, False), (3.0, True))
GPT2_RUNS = sum(GPT2_SEEDS * (1 + len(GPT2_CONFIGS)) if compared else 1 for _, compared in GPT2_CELLS)


def _probe(call: Call, steps: int) -> float:
    """Seconds a plain run of ``steps`` takes, start-up and validation included."""
    started = time.monotonic()
    fit(call.config("char_gpt_gpt2", steps, [], val_every=12), hybrid=False)
    return time.monotonic() - started


def _gpt2_plan(call: Call) -> dict[str, Any]:
    """The run length, from two probe runs (a step's time and a run's fixed cost), to fit what is left of this
    call, at most 20 minutes of runs; a multiple of 10, so that the last of 10 evaluations is at the last step."""
    _probe(call, 12)  # CUDA's and the data's one-time costs
    short, long = _probe(call, 12), _probe(call, 36)
    per_step = max(1e-3, (long - short) / 24)
    fixed = max(0.0, short - 12 * per_step)
    minutes = min(20.0, 0.85 * call.left() / 60)
    steps = 10 * int(min(200, max(20, (minutes * 60 / GPT2_RUNS - fixed) / (per_step * 1.3) / 10)))
    lr = float(call.config("char_gpt_gpt2", 12, []).model.lr)
    planned = round(GPT2_RUNS * (fixed + per_step * steps * 1.3) / 60, 1)
    print(f"gpt2 plan: {steps} steps a run, {per_step:.3f} s a step, {fixed:.1f} s fixed, ~{planned} min")
    return {"steps": 8 if call.dry else steps, "step_s": per_step, "fixed_s": fixed, "lr": lr, "minutes": planned}


def gpt2(call: Call, record: dict[str, Any], save: Callable[[], None]) -> dict[str, Any]:
    """Plain against the defaults (``outer`` with its guards, ``state_on_host`` as on every CUDA run) on
    ``char_gpt_gpt2`` at the task's rate, a third of it and 3 times it, 3 seeds, and plain at a ninth and 9 times it
    (seed 0)."""
    if "plan" not in record:
        record["plan"] = _gpt2_plan(call)
        save()
    plan, runs = record["plan"], record.setdefault("runs", {})
    base = plan["lr"]
    for factor, compared in GPT2_CELLS:
        lr = base * factor
        for seed in range(GPT2_SEEDS if compared else 1):
            for config in ("plain", *GPT2_CONFIGS) if compared else ("plain",):
                key = f"lr{lr:.3g}_seed{seed}_{config}"
                if key in runs:
                    continue
                if call.left() < plan["fixed_s"] + plan["step_s"] * plan["steps"] * 1.6:
                    return record | {"complete": False}
                cfg = call.config(
                    "char_gpt_gpt2", plan["steps"], [f"model.lr={lr}", *GPT2_CONFIGS.get(config, [])], seed
                )
                runs[key] = fit(cfg, hybrid=config != "plain").to_dict()
                save()
    record["comparisons"], record["sweep"] = _gpt2_comparisons(base, runs), _gpt2_sweep(base, runs)
    return record | {"complete": True}


def _gpt2_sweep(base: float, runs: dict[str, Any]) -> dict[str, Any]:
    """Plain's final validation loss at each rate (seed 0), and the rate with the lowest: the tuned one."""
    finals = {}
    for factor in sorted(factor for factor, _ in GPT2_CELLS):
        if (run := runs.get(f"lr{base * factor:.3g}_seed0_plain")) is not None:
            finals[f"{base * factor:.3g}"] = record_from(run).curve.points[-1].val_loss
    return {"final_val_loss_by_lr": finals, "tuned_lr": min(finals, key=finals.get)}


def _gpt2_comparisons(base: float, runs: dict[str, Any]) -> dict[str, Any]:
    """Per rate and configuration with every seed run: speedups to plain's final loss in backward passes and in
    seconds (None where not reached in plain's steps), and the loss at plain's last evaluation."""
    out = {}
    for factor, compared in GPT2_CELLS:
        lr = base * factor
        for config in GPT2_CONFIGS if compared else ():
            if any(f"lr{lr:.3g}_seed{s}_{c}" not in runs for s in range(GPT2_SEEDS) for c in ("plain", config)):
                continue
            seeds = []
            for seed in range(GPT2_SEEDS):
                plain, other = (record_from(runs[f"lr{lr:.3g}_seed{seed}_{c}"]) for c in ("plain", config))
                seeds.append(compare_seed(plain, other, plain.curve.points[-1].step))
            row: dict[str, Any] = {"loss_equal_steps": [s["loss_ratio_equal_steps"] for s in seeds]}
            for axis in ("backward", "wall_s"):
                speedups = [s["to_target"][axis]["speedup"] for s in seeds]
                known = [v for v in speedups if v is not None]
                row[f"{axis}_speedups"] = speedups
                row[f"{axis}_median"] = statistics.median(known) if len(known) == len(seeds) else None
            out[f"lr{lr:.3g}_{config}"] = row
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
PARTS = (*MECHANICS, "overheads", "gpt2")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1, default=str))


def run(parts: list[str], out: Path, budget_min: float, dry: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    mechanics, overheads_file, gpt2_file = out / "mechanics.json", out / "overheads.json", out / "gpt2.json"
    done = {"mechanics": _load(mechanics), "overheads": _load(overheads_file), "gpt2": _load(gpt2_file)}
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
                if call.left() < 4 * 60 and not dry:
                    continue
                done["overheads"] = {"result": _attempt(overheads, call), "machine": machine()}
                _write(overheads_file, done["overheads"])
            elif part == "gpt2" and not done["gpt2"].get("complete"):
                record = done["gpt2"]

                def save(record: dict[str, Any] = record) -> None:
                    _write(gpt2_file, record | {"machine": machine()})

                try:
                    done["gpt2"] = gpt2(call, record, save)
                except Exception:  # the part's error is its result; the runs so far stay in the file
                    done["gpt2"] = record | {"error": traceback.format_exc()[-3000:]}
                _write(gpt2_file, done["gpt2"] | {"machine": machine()})
            write_atomic(out / "README.md", markdown(done))
    return done


def _attempt(fn: Callable[[Call], dict[str, Any]], call: Call) -> dict[str, Any]:
    try:
        return fn(call)
    except Exception:  # recorded, and the other parts still run
        return {"error": traceback.format_exc()[-3000:]}


def markdown(done: dict[str, Any]) -> str:
    recorded = [d["machine"] for d in (done["gpt2"], done["overheads"], done["mechanics"]) if "machine" in d]
    where = recorded[0] if recorded else machine()  # the GPU's, when the results are read back elsewhere
    lines = ["# The GPU proof (`python -m benchmarks.gpu`)", "", f"Machine: {where}", "", "| part | result |"]
    lines.append("|---|---|")
    for part, result in done["mechanics"].items():
        if part != "machine":
            lines.append(f"| {part} | {_short(result)} |")
    lines.append(f"| overheads | {_short(done['overheads'].get('result', {'not run': True}))} |")
    gpt2_done = done["gpt2"]
    summary = gpt2_done.get("comparisons") or {"runs so far": len(gpt2_done.get("runs", {}))}
    lines.append(f"| gpt2 | {_short(summary)} |")
    return "\n".join(lines) + "\n"


def _short(result: dict[str, Any]) -> str:
    keys = ("error", "skipped", "passed", "flat", "growth_within_each_phase", "hybrid_over_plain")
    picked = {k: result[k] for k in keys if k in result} or result
    return json.dumps(picked, default=str)[:400].replace("|", "/")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--budget-min", type=float, default=7.0, help="minutes this call may start work in")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU; the CUDA-only parts skipped")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/gpu/<date>")
    args = parser.parse_args(argv)
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    out = args.out or RESULTS / "gpu" / datetime.date.today().isoformat()
    done = run(args.parts, out, args.budget_min, args.dry_run)
    print(markdown(done))


if __name__ == "__main__":
    main()
