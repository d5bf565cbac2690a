"""Time to reach plain Lightning's validation quality with hybrid training, measured side by side.

    python -m benchmarks.run --task char_gpt --seeds 3          # the default length (600 steps)
    python -m benchmarks.run --task all --quick                 # every task, a minute or two
    python -m benchmarks.run --task char_gpt --long predictor=rssm hybrid.confidence_threshold=0.3
    python -m benchmarks.run --task all --seeds 5 --threads 1    # quieter on a shared CPU: results/cpu_1thread

Per seed the baseline (the same experiment with plain Lightning: same module, optimizer, LR schedule, batch
order and seed) and the hybrid run alternate in this process, so drift of the machine hits both. The target is
the baseline's final validation loss; hybrid may train up to 1.5x the baseline's steps to reach it. Trailing
arguments are Hydra overrides of the app config, applied to both runs. Writes ``<task>_<length>_<name>.json``
and ``.png`` into ``--out`` and rewrites ``table.md`` there from every result in it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning
import torch
from omegaconf import open_dict

from benchmarks.curves import AXES, Curve, CurveRecorder, time_to_target, value_at
from benchmarks.report import plot_task, write_atomic, write_table
from benchmarks.tasks import TASKS, Length, compose_run, hybrid_steps, length_of
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.runner import build_run

RESULTS = Path(__file__).parent / "results"
CPU_TASKS = ("char_gpt", "digits_cnn", "word_lstm")  # `--task all`; the GPT-2-sized one is for GPUs


@dataclass
class Record:
    """One fit: its curve and what the plugin counted."""

    curve: Curve
    device: str
    steps: int
    backward_skipped_pct: float = 0.0
    rollbacks: int = 0
    segments_started: int = 0
    peak_cuda_allocated_bytes: int | None = None
    jumps_blind: int = 0  # cycle ends whose losses were too noisy for the verdict to judge a jump

    def to_dict(self) -> dict[str, Any]:
        keys = (
            "device",
            "steps",
            "backward_skipped_pct",
            "rollbacks",
            "segments_started",
            "peak_cuda_allocated_bytes",
            "jumps_blind",
        )
        return {k: getattr(self, k) for k in keys} | self.curve.to_dict()


def fit_measured(cfg: Any, hybrid: bool, callbacks: list[Any] | None = None) -> tuple[Any, int | None]:
    """Build and fit one run; return its Trainer and, on a GPU, the fit's peak CUDA allocated bytes."""
    trainer, model, data, _ = build_run(cfg, hybrid, extra_callbacks=callbacks or [])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(model, data)
    cuda = trainer.strategy.root_device.type == "cuda"
    return trainer, torch.cuda.max_memory_allocated() if cuda else None


def fit(cfg: Any, hybrid: bool, stop: Any = None, callbacks: Sequence[Any] = ()) -> Record:
    recorder = CurveRecorder(cfg.monitor, stop)
    trainer, peak = fit_measured(cfg, hybrid, [recorder, *callbacks])
    scheduler = find_scheduler(trainer)
    record = Record(recorder.curve, trainer.strategy.root_device.type, trainer.global_step)
    record.peak_cuda_allocated_bytes = peak
    if scheduler is not None:
        counters = scheduler.counters
        record.backward_skipped_pct = round(counters.backward_skipped_pct, 3)
        record.rollbacks, record.segments_started = counters.rollbacks, counters.predictions_made  # or jumps
        record.jumps_blind = counters.jumps_blind
    return record


def compare_seed(baseline: Record, hybrid: Record, steps: int) -> dict[str, Any]:
    """Everything the report says about one seed; ``None`` wherever hybrid did not get there."""
    target = baseline.curve.points[-1].val_loss
    result: dict[str, Any] = {"target": target, "to_target": {}, "loss_ratio_equal_time": {}}
    for axis in AXES:
        b = time_to_target(baseline.curve.axis(axis), baseline.curve.losses, target)
        h = time_to_target(hybrid.curve.axis(axis), hybrid.curve.losses, target)
        result["to_target"][axis] = {"baseline": b, "hybrid": h, "speedup": b / h if h else None}
        at = value_at(hybrid.curve.axis(axis), hybrid.curve.losses, getattr(baseline.curve.points[-1], axis))
        result["loss_ratio_equal_time"][axis] = None if at is None else at / target
    at_steps = hybrid.curve.at_step(steps)
    result["loss_ratio_equal_steps"] = None if at_steps is None else at_steps / target
    result["hybrid_best_loss"] = min(hybrid.curve.losses)
    result["baseline"], result["hybrid"] = baseline.to_dict(), hybrid.to_dict()
    return result


def baseline_target(baseline: Record, spec: Length) -> Callable[[Curve], bool]:
    """When a hybrid run has shown enough: it has reached the baseline's final loss and passed the baseline's
    steps and time, so nothing is left to report."""
    end = baseline.curve.points[-1]
    clock = "wall_s" if baseline.device == "cuda" else "cpu_s"

    def shown_enough(curve: Curve) -> bool:
        last = curve.points[-1]
        reached = min(curve.losses) <= end.val_loss
        return reached and last.step >= spec.steps and getattr(last, clock) >= getattr(end, clock)

    return shown_enough


def hybrid_against(
    task: str, spec: Length, seed: int, overrides: list[str], workdir: str, baseline: Record, max_steps: int
) -> dict[str, Any]:
    """One hybrid run of ``max_steps`` at most, compared with its seed's ``baseline``."""
    cfg = compose_run(task, spec, seed, overrides, workdir)
    with open_dict(cfg):
        cfg.trainer.max_steps = max_steps
    hybrid = fit(cfg, hybrid=True, stop=baseline_target(baseline, spec))
    clock = "wall_s" if baseline.device == "cuda" else "cpu_s"
    return {"seed": seed, "clock": clock} | compare_seed(baseline, hybrid, spec.steps)


def warm_up(task: str, spec: Length, overrides: list[str], workdir: str) -> None:
    """A discarded short run: one-time costs (lazy init, allocator, data setup) must not hit run 1 alone."""
    warm = compose_run(task, spec, 0, overrides, workdir)
    with open_dict(warm):
        warm.trainer.max_steps = warm.trainer.val_check_interval = min(20, spec.steps)
    fit(warm, hybrid=True)


def run_task(task: str, spec: Length, seeds: int, overrides: list[str], workdir: str) -> dict[str, Any]:
    warm_up(task, spec, overrides, workdir)
    per_seed = []
    for seed in range(seeds):
        baseline = fit(compose_run(task, spec, seed, overrides, workdir), hybrid=False)
        per_seed.append(hybrid_against(task, spec, seed, overrides, workdir, baseline, hybrid_steps(spec)))
        speedup = per_seed[-1]["to_target"][per_seed[-1]["clock"]]["speedup"]
        print(f"{task} seed {seed}: target {per_seed[-1]['target']:.4f}, speedup {speedup}")
    return {"task": task, "length": spec.name, "steps": spec.steps, "overrides": overrides, "seeds": per_seed}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Median and range over seeds of each reported figure, on the seeds' headline clock."""
    seeds = result["seeds"]
    clock = seeds[0]["clock"]

    def spread(values: list[float | None]) -> dict[str, Any]:
        known = [v for v in values if v is not None]
        if len(known) < len(values):
            return {"median": None, "min": None, "max": None, "missing": len(values) - len(known)}
        return {"median": statistics.median(known), "min": min(known), "max": max(known), "missing": 0}

    return {
        "clock": clock,
        "speedup": spread([s["to_target"][clock]["speedup"] for s in seeds]),
        "backward_ratio": spread([s["to_target"]["backward"]["speedup"] for s in seeds]),
        "loss_ratio_equal_steps": spread([s["loss_ratio_equal_steps"] for s in seeds]),
        "loss_ratio_equal_time": spread([s["loss_ratio_equal_time"][clock] for s in seeds]),
        "backward_skipped_pct": spread([s["hybrid"]["backward_skipped_pct"] for s in seeds]),
        "rollbacks": sum(s["hybrid"]["rollbacks"] for s in seeds),
        "hybrid_best_loss": spread([s["hybrid_best_loss"] for s in seeds]),
        "target": spread([s["target"] for s in seeds]),
    }


def machine() -> dict[str, Any]:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # kernels differ in rounding between these
    }
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name()
    return info


def results_folder(length: str, threads: int | None, device: str) -> Path:
    """Where a run's results go by default: trial runs (``--quick``) into ``results/quick``, which git ignores, so
    a trial never changes the committed tables; named runs into the device's folder."""
    if length == "quick":
        return RESULTS / "quick"
    return RESULTS / (device if threads is None else f"{device}_{threads}thread")


def label(overrides: list[str]) -> str:
    """A configuration's file-name label, from its overrides."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", "_".join(overrides)) or "defaults"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="all", choices=[*TASKS, "all"], help="all: every task but char_gpt_gpt2")
    parser.add_argument("--seeds", type=int, default=3)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", const="quick", dest="length", help="a few dozen steps")
    group.add_argument("--long", action="store_const", const="long", dest="length", help="several thousand steps")
    parser.add_argument("--steps", type=int, default=None, help="train this many steps instead of a named length")
    parser.add_argument("--name", default=None, help="label of this hybrid configuration (default: from overrides)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results/<device>, <device>_<N>thread with --threads; "
        "benchmarks/results/quick with --quick, which is not committed)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the app config, e.g. predictor=rssm")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    length = args.length or "default"
    name = args.name or label(args.overrides)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or results_folder(length, args.threads, device)
    out.mkdir(parents=True, exist_ok=True)
    for task in CPU_TASKS if args.task == "all" else [args.task]:
        with tempfile.TemporaryDirectory() as workdir:
            result = run_task(task, length_of(task, length, args.steps), args.seeds, args.overrides, workdir)
        save_result(out, result, name)
    print(write_table(out))


def save_result(out: Path, result: dict[str, Any], name: str) -> None:
    """Write one configuration's result as ``<task>_<length>_<name>.json`` and its plot beside it."""
    result |= {"name": name, "machine": machine(), "summary": summarize(result)}
    stem = f"{result['task']}_{result['length']}_{name}"
    write_atomic(out / f"{stem}.json", json.dumps(result, indent=1))
    plot_task(result, out / f"{stem}.png")


if __name__ == "__main__":
    main()
