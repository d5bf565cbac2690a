"""What the plugin itself costs: per-component time, overhead on ordinary steps, Predict-step cost, peak memory.

    python -m benchmarks.overheads                  # both model sizes, one torch thread; writes overheads.json/.md
    python -m benchmarks.overheads --sizes 1M --quick
    python -m benchmarks.overheads --sizes 1M --parts rules --rounds 3 --out benchmarks/results/overheads_rules

All runs are the app's character GPT at two sizes, built by the harness like any benchmark run.

- Components are stateful (online training every few steps, running statistics), so they are timed in place
  during a real hybrid fit that predicts, each call wrapped in a timer (on CUDA with a synchronize either side),
  rather than replayed in isolation. Costs are per call and as a share of the run's ordinary-step time.
- Overhead on ordinary steps: hybrid runs that never predict against plain Lightning, alternating in this
  process; the median of the per-round ratios of training time (CPU time on CPU, wall time on a GPU). Two
  modes: still capturing updates and training the predictor (``backoff_after=0``, never confident), and
  prediction off (``enable_prediction=false``: every step takes the backed-off path, where a run whose predictor
  never earns confidence ends up). Each ratio twice: over the whole fit, and over steady steps (the median step
  after the first ``SETTLE`` of each run, which leaves out one-time costs: the first touch of the plugin's
  buffers, oneDNN's first calls).
- Predict-step cost: mean Predict step over mean Full step of the same run, with the forward check on every
  predicted step (``predict_forward_every=1``) and without it (``0``).
- What the rule costs per step (``rules``): ``outer`` with ``keep_norms`` against plain, alternating in this
  process; every backward pass is kept, so the ratio is the rule's own work (its jumps, listed beside it).
  ``outer_aside`` is the default where it steps aside: with a limit no cycle meets, no cycle can be judged and no
  jump is made, so its ratio is what it costs a run where its verdict cannot see.
- Peak memory: each run in its own process (peak RSS is per process); on CUDA the peak allocated/reserved bytes.
  Plain, and each predictor that holds parameter-sized state: ``linear`` tracking (outside Predict) and
  predicting, each with the update's buffer per step and kept (``capture_buffer``), and ``outer``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from benchmarks.harness import (
    HYBRID,
    IDLE_MODES,
    PER_STEP,
    PREDICTING,
    SIZES,
    TRACKING,
    against_plain,
    gpt_config,
    machine,
    results_folder,
)
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.callbacks.memory import proc_status
from lightning_hybrid.engine import PredictSegments
from lightning_hybrid.runner import build_run

STEPS = {
    "1M": {"profile": 160, "overhead": 150, "rounds": 5, "memory": 60, "rules": 600},
    "25M": {"profile": 60, "overhead": 20, "rounds": 5, "memory": 30, "rules": 200},
    "25M_batch32": {"profile": 20, "overhead": 10, "rounds": 3, "memory": 10, "rules": 40},
}
PARTS = ("profile", "overhead", "rules", "memory")
QUICK = {"profile": 40, "overhead": 20, "rounds": 1, "memory": 40, "rules": 60}
QUICK_RULES = ["hybrid.warmup_steps=10", "hybrid.full_steps=10", "model.warmup_steps=5"]  # 60 steps hold jumps
COMPONENTS = {
    "state encoding": ("encoder", ("observe", "features", "loss_trend")),
    "predictor observe + online training": ("predictor", ("observe",)),
    "predictor plan (per segment)": ("predictor", ("plan",)),
    "predicted update (per predicted step)": ("segments", ("_apply_prediction",)),
    "update capture (per ordinary step)": ("engine", ("before_optimizer_step", "after_optimizer_step")),
    "divergence check (per ordinary step)": ("engine", ("_check_ordinary_step",)),
    "divergence monitor check (per forward check)": ("monitor", ("check",)),
    "corrector": ("corrector", ("correction", "correct", "observe", "reanchor")),
    "bandit": ("bandit", ("choose", "update", "record_step", "begin", "finish")),
}


def _timed(fn: Callable, log: list[float], sync: Callable[[], None]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync()
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sync()
            log.append(time.perf_counter() - start)

    return wrapper


def profile(size: str, steps: int, forward_every: int, workdir: str) -> dict[str, Any]:
    """One predicting hybrid fit with every component's calls timed."""
    cfg = gpt_config(size, steps, workdir, [*PREDICTING, f"hybrid.predict_forward_every={forward_every}"])
    trainer, model, data, _ = build_run(cfg, hybrid=True)
    scheduler = find_scheduler(trainer)
    host = _callback(trainer, "DynamicsPredictor")
    objects = {
        "engine": scheduler.engine,
        "segments": PredictSegments,  # the family is built when fit starts: its class is timed, for this fit only
        "encoder": host.encoder,
        "predictor": host.predictor,
        "monitor": _callback(trainer, "DivergenceMonitor").divergence,
        "corrector": _callback(trainer, "ResidualCorrector").correction,
        "bandit": _callback(trainer, "HorizonBandit").horizons,
    }
    sync = torch.cuda.synchronize if torch.cuda.is_available() and cfg.trainer.accelerator != "cpu" else lambda: None
    logs: dict[str, list[float]] = {}
    with contextlib.ExitStack() as timed:
        for label, (name, methods) in COMPONENTS.items():
            log = logs.setdefault(label, [])
            for method in methods:
                obj = objects[name]
                timed.enter_context(mock.patch.object(obj, method, _timed(getattr(obj, method), log, sync)))
        trainer.fit(model, data)
    counters = scheduler.counters
    ordinary = ("warmup", "full", "correct")
    ordinary_s = sum(counters.time_by_phase_s[p] for p in ordinary)
    ordinary_n = sum(counters.steps_by_phase[p] for p in ordinary)
    per_step = {p: counters.time_by_phase_s[p] / max(1, counters.steps_by_phase[p]) for p in ("full", "predict")}
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "steps_by_phase": counters.steps_by_phase,
        "ordinary_step_ms": 1000 * ordinary_s / max(1, ordinary_n),
        "full_step_ms": 1000 * per_step["full"],
        "predict_step_ms": 1000 * per_step["predict"],
        "predict_over_full": per_step["predict"] / per_step["full"] if counters.steps_by_phase["predict"] else None,
        "components": {
            label: {
                "calls": len(log),
                "ms_per_call": 1000 * statistics.fmean(log) if log else None,
                "share_of_ordinary_time": sum(log) / ordinary_s,
            }
            for label, log in logs.items()
        },
    }


def _callback(trainer: Any, name: str) -> Any:
    return next(cb for cb in trainer.callbacks if type(cb).__name__ == name)


IDLE_LABELS = {  # mode -> (what the report calls it, the goal)
    "tracking": ("capturing every update", "1.03"),
    "tracking_per_step": ("capturing every update into a per-step buffer (`capture_buffer=per_step`)", "1.03"),
    "tracking_every_4": ("capturing one update in 4 (`observe_every=4`)", "1.03"),
    "backed_off": ("prediction off (backed off)", "1.01"),
}


RULE_MODES = {"outer_norm": HYBRID["outer_norm"]}  # the lrs harness's overrides
# the default where it steps aside: a limit no cycle's margin meets, so every cycle is too noisy to judge a jump
RULE_MODES["outer_aside"] = ["predictor=outer", "predictor.verify_resolution=1e-12"]
RULE_LABELS = {  # mode -> (what the report calls it, the goal)
    "outer_norm": ("`outer` with `keep_norms` (jumps every `full_steps`)", None),
    "outer_aside": ("the default (`outer` with its guards) stepping aside (no cycle judged, no jump)", "1.01"),
}


def ordinary_overhead(size: str, steps: int, rounds: int, workdir: str) -> dict[str, Any]:
    """Hybrid runs that never predict against plain Lightning, alternating, same seed and batches."""
    return against_plain(size, steps, rounds, workdir, IDLE_MODES)


def rule_overhead(size: str, steps: int, rounds: int, workdir: str, extra: list[str]) -> dict[str, Any]:
    """The trajectory rules (with ``extra`` overrides) against plain Lightning, alternating, same seed and batches
    (every backward kept)."""
    modes = {mode: [*overrides, *extra] for mode, overrides in RULE_MODES.items()}
    return against_plain(size, steps, rounds, workdir, modes)


MEMORY_RUNS = {  # label -> overrides (None: plain Lightning); the rules jump every 10 steps after 20
    "plain": None,
    "linear_tracking": TRACKING,  # outside Predict: what the goal is about
    "linear_tracking_per_step": [*TRACKING, PER_STEP],
    "linear_predicting": PREDICTING,
    "linear_predicting_per_step": [*PREDICTING, PER_STEP],
    "outer": ["predictor=outer", "hybrid.warmup_steps=20", "hybrid.full_steps=10"],
}


def peak_memory(size: str, steps: int, label: str, workdir: str) -> dict[str, Any]:
    """Run one fit and return its peak memory; called in a fresh process (see ``--memory-child``). On Linux the
    peak RSS is reset just before ``fit`` so the figure is the fit's own growth over the memory before it."""
    extra = MEMORY_RUNS[label]
    cfg = gpt_config(size, steps, workdir, extra or [])
    trainer, model, data, _ = build_run(cfg, hybrid=extra is not None)
    cuda = torch.cuda.is_available() and cfg.trainer.accelerator != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS to the current RSS
        before = proc_status("VmRSS")
    except OSError:
        before = 0
    trainer.fit(model, data)
    peak = proc_status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "rss_before_fit_bytes": before,
        "peak_rss_growth_bytes": peak - (before or 0),
    }
    if cuda:
        out |= {
            "peak_cuda_allocated_bytes": torch.cuda.max_memory_allocated(),
            "peak_cuda_reserved_bytes": torch.cuda.max_memory_reserved(),
        }
    scheduler = find_scheduler(trainer)
    if scheduler is not None:
        out["predicted_steps"] = scheduler.counters.steps_by_phase["predict"]
    return out


QUICK_MEMORY_RUNS = ("plain", "linear_predicting", "outer")  # --quick: one run of each kind checks the machinery


def in_a_fork(label: str, size: str, steps: int, workdir: str) -> dict[str, Any]:
    """:func:`peak_memory` of one run in a child forked from this process: each run starts from the same memory,
    the imports made once (a fresh interpreter spends seconds importing Lightning before it runs anything)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one fit, its figures through the pipe, then out without the interpreter's teardown
        os.close(read)
        try:
            os.write(write, json.dumps(peak_memory(size, steps, label, workdir)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not said:
        raise RuntimeError(f"the memory run {label!r} failed (wait status {status})")
    return json.loads(said)


def memory(size: str, steps: int, threads: int, labels: tuple[str, ...] = tuple(MEMORY_RUNS)) -> dict[str, Any]:
    """Each run of ``labels`` (of ``MEMORY_RUNS``) in a process of its own, forked from one fresh process that only
    imported; every hybrid one's growth over plain's."""
    cmd = [sys.executable, "-m", "benchmarks.overheads", "--memory-child", *labels, "--sizes", size]
    cmd += ["--child-steps", str(steps), "--threads", str(threads)]
    root = Path(__file__).parent.parent  # where `-m benchmarks` imports from
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=root).stdout.strip().splitlines()
    runs = dict(zip(labels, map(json.loads, lines[-len(labels) :])))
    plain = runs["plain"]
    extra = {
        label: {k: run[k] - plain[k] for k in plain if k.startswith("peak_")}
        for label, run in runs.items()
        if label != "plain"
    }
    copies = {label: {k: v / plain["param_bytes"] for k, v in e.items()} for label, e in extra.items()}
    return {"runs": runs, "hybrid_minus_plain_bytes": extra, "in_parameter_copies": copies}


def _kept(mode: str, counts: dict[str, int]) -> str:
    """What one run of a rule did: its jumps (and cycles too noisy to judge one)."""
    blind = counts.get("blind", 0)  # result files from before the count have none
    return f"{counts['jumps']} jumps" + (f" ({blind} cycles too noisy to judge one)" if blind else "")


def to_markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Machine: {results['machine'].get('cuda_device', results['machine']['processor'])}, "
        f"{results['machine']['torch_threads']} torch threads.",
        "",
    ]
    for size, r in results["sizes"].items():
        lines += [f"### {size}", ""]
        if "profile" in r:
            p = r["profile"]
            lines += [
                f"{p['params'] / 1e6:.2f}M parameters, ordinary step {p['ordinary_step_ms']:.1f} ms",
                "",
                "| component | calls | ms per call | share of ordinary-step time |",
                "|---|---|---|---|",
            ]
            for label, c in p["components"].items():
                ms = "-" if c["ms_per_call"] is None else f"{c['ms_per_call']:.3f}"
                lines.append(f"| {label} | {c['calls']} | {ms} | {100 * c['share_of_ordinary_time']:.2f}% |")
            lines.append("")
        if "ordinary_overhead" in r:
            o = r["ordinary_overhead"]
            for mode, (what, goal) in IDLE_LABELS.items():
                ratios, steady = o["ratios"][mode], o["steady_ratios"][mode]
                lines.append(
                    f"- Ordinary steps, hybrid never predicting, {what} / plain ({o['clock']}, median of "
                    f"{len(ratios)} rounds): whole fit **{o['hybrid_over_plain'][mode]:.3f}** "
                    f"({min(ratios):.3f}-{max(ratios):.3f}), steady steps "
                    f"**{o['steady_hybrid_over_plain'][mode]:.3f}** ({min(steady):.3f}-{max(steady):.3f}) "
                    f"(goal <= {goal})"
                )
        if "rule_overhead" in r:
            o = r["rule_overhead"]
            for mode, (what, goal) in RULE_LABELS.items():
                ratios, steady = o["ratios"][mode], o["steady_ratios"][mode]
                kept = ", ".join(_kept(mode, k) for k in o["kept"][mode])
                lines.append(
                    f"- {what} / plain over {o['steps']} steps ({o['clock']}, median of {len(ratios)} rounds): whole "
                    f"fit **{o['hybrid_over_plain'][mode]:.3f}** ({min(ratios):.3f}-{max(ratios):.3f}), steady steps "
                    f"**{o['steady_hybrid_over_plain'][mode]:.3f}** ({min(steady):.3f}-{max(steady):.3f})"
                    + (f" (goal <= {goal})" if goal else "")
                    + f"; kept per round: {kept}"
                )
        if "predict_step" in r:
            for key, goal in (("with_check", "0.40"), ("without_check", "0.10")):
                ratio = r["predict_step"][key]
                shown = "n/a" if ratio is None else f"**{ratio:.3f}**"
                lines.append(f"- Predict step / Full step, {key.replace('_', ' ')}: {shown} (goal <= {goal})")
        if "memory" in r:
            m = r["memory"]
            for label, extra in m["hybrid_minus_plain_bytes"].items():
                shown = ", ".join(
                    f"{k.removeprefix('peak_').removesuffix('_bytes')} {v / 2**20:+.1f} MiB"
                    f" ({m['in_parameter_copies'][label][k]:.2f} parameter copies)"
                    for k, v in extra.items()
                )
                lines.append(f"- Peak memory, `{label}` minus plain: {shown} (goal <= 1 copy)")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["1M", "25M"], choices=list(SIZES))
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="what to measure (default: all)")
    parser.add_argument("--quick", action="store_true", help="few steps, one round: checks the script runs")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results/<device>; benchmarks/results/quick with --quick)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default: the size's own)")
    parser.add_argument("--memory-child", nargs="+", choices=list(MEMORY_RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--child-steps", type=int, default=40, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child:  # a fresh process: one fork a run, each printing its figures on a line of its own
        with tempfile.TemporaryDirectory() as workdir:
            for label in args.memory_child:
                print(json.dumps(in_a_fork(label, args.sizes[0], args.child_steps, workdir)), flush=True)
        return
    results: dict[str, Any] = {"machine": machine(), "sizes": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for size in args.sizes:
            steps = QUICK if args.quick else STEPS[size]
            if args.rounds is not None:
                steps = steps | {"rounds": args.rounds}
            result = results["sizes"][size] = {}
            if "profile" in args.parts:
                with_check = profile(size, steps["profile"], 1, workdir)
                without = profile(size, steps["profile"], 0, workdir)
                result["profile"] = with_check
                result["predict_step"] = {
                    "with_check": with_check["predict_over_full"],
                    "without_check": without["predict_over_full"],
                }
            if "overhead" in args.parts:
                result["ordinary_overhead"] = ordinary_overhead(size, steps["overhead"], steps["rounds"], workdir)
            if "rules" in args.parts:
                extra = QUICK_RULES if args.quick else []
                result["rule_overhead"] = rule_overhead(size, steps["rules"], steps["rounds"], workdir, extra)
            if "memory" in args.parts:
                labels = QUICK_MEMORY_RUNS if args.quick else tuple(MEMORY_RUNS)
                result["memory"] = memory(size, steps["memory"], args.threads, labels)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or results_folder("quick" if args.quick else "default", args.threads, device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overheads.json").write_text(json.dumps(results, indent=1))
    text = to_markdown(results)
    (out / "overheads.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
