"""The benchmark harness's core: the configurations it compares, one fit and the record it leaves, and result
files. The drivers (``run``, ``lrs``, ``overheads``, ``gpu``, ``long_run``, ``host_work``) import only from here
and from the task, curve, report and peer modules; none imports another driver."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning
import lightning as L
import torch
from omegaconf import open_dict

from benchmarks.curves import AXES, Curve, CurveRecorder, Point, overfits, rise_at_end, time_to_target, value_at
from benchmarks.tasks import TASKS, Length, check_passes, compose_run, trainer_steps
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.runner import build_run

RESULTS = Path(__file__).parent / "results"

# -- the configurations --------------------------------------------------------------------------------------------
# `outer` as SNOO publishes it, without the guards its defaults now carry: each configuration below adds its own
UNGUARDED = ["predictor=outer", "predictor.keep_norms=false", "predictor.restart=false"]
UNGUARDED += ["predictor.verify_resolution=0"]
# jumps that change direction, not each tensor's scale, with no jump (and the momentum reset) where a cycle points
# against the momentum
OUTER_NORM_RESTART = [*UNGUARDED, "predictor.keep_norms=true", "predictor.restart=true"]
HYBRID = {  # configuration -> overrides
    "outer": UNGUARDED,
    "outer_aligned": [*UNGUARDED, "predictor.alignment_window=5"],  # jumps stop once training walks them back
    "outer_norm": [*UNGUARDED, "predictor.keep_norms=true"],  # jumps change direction, not each tensor's scale
    "outer_norm_aligned": [*UNGUARDED, "predictor.keep_norms=true", "predictor.alignment_window=5"],  # both
    "outer_norm_restart": OUTER_NORM_RESTART,
    # the same, making no jump where a cycle's losses spread too widely for the delayed verdict to see a 20% rise:
    # the defaults (`keep_norms`, `restart`, `verify_resolution=0.2`), so no override at all
    "outer_norm_restart_res": [],
    "outer_norm_restart_mu6": [*OUTER_NORM_RESTART, "predictor.outer_momentum=0.6"],  # 0.7 / 0.4 = 1.75 cycles
}
# primal averaging with its average's window (1 / (1 - mu_x) steps) the share of the run that the published mu_x
# (0.9967: 303 steps) is of the scale grid's 25-token run of 5,740 steps, where it was no worse than plain
GPA_WINDOW_SHARE = 1 / (1 - 0.9967) / 5740


def gpa_mu_x(steps: int) -> float:
    """Primal averaging's ``mu_x`` for a run of ``steps``, its window the share ``GPA_WINDOW_SHARE`` of the run."""
    return round(1 - 1 / (GPA_WINDOW_SHARE * steps), 6)


# the character GPT's sizes the overhead and long-run drivers use; parameters: 1.07M and 25.5M
SIZES = {  # overrides of the character GPT; parameters: 1.07M, 25.5M and 85M
    "1M": ["model.n_layer=4", "model.n_embd=144", "model.n_head=4", "data.batch_size=32"],
    "25M": ["model.n_layer=8", "model.n_embd=512", "model.n_head=8", "data.batch_size=8"],
    "85M": [o for o in TASKS["char_gpt_gpt2"].overrides if not o.startswith("model.lr=")],  # the GPT-2 shape
    # the same model on 4x the batch: the backward's activations, not the optimizer step, make the fit's peak
    "25M_batch32": ["model.n_layer=8", "model.n_embd=512", "model.n_head=8", "data.batch_size=32"],
    # a few thousand parameters: the suite runs the drivers on it so that they cannot rot (its figures mean nothing)
    "tiny": ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "data.batch_size=8", "data.max_bytes=20000"],
}
# per-step prediction as often as possible, so every component is exercised many times
PREDICTING = [  # predict as often as possible, so every component is exercised many times
    "predictor=linear",  # the per-step machinery these figures are about (the app's default is outer)
    "hybrid.warmup_steps=20",
    "hybrid.full_steps=10",
    "hybrid.confidence_threshold=0.0",
    "hybrid.predict_lr_fraction=1.0",
    "hybrid.max_consecutive_rollbacks=1000",
    "hybrid.exploration_plays=1000",
]
# label -> (component, methods); a call's cost includes the work it delegates. Metric logging is not listed: the
# benchmark runs without a logger, and without one the scheduler builds no metrics at all.


TRACKING = ["hybrid.confidence_threshold=1.0", "hybrid.backoff_after=0", "hybrid.predict_lr_fraction=1.0"]
PER_STEP = "hybrid.capture_buffer=per_step"  # the update's buffer held only while in use (the default on CUDA)
IDLE_MODES = {  # hybrid runs that never predict: tracking every update or one in 4, and backed off (the default's fate)
    "tracking": TRACKING,
    "tracking_per_step": [*TRACKING, PER_STEP],
    "tracking_every_4": [*TRACKING, "hybrid.observe_every=4"],
    "backed_off": ["hybrid.enable_prediction=false"],
}


# -- one fit and its record ----------------------------------------------------------------------------------------
@dataclass
class Record:
    """One fit: its curve, the data it read and what the plugin counted."""

    curve: Curve
    device: str
    steps: int
    backward_skipped_pct: float = 0.0
    rollbacks: int = 0
    segments_started: int = 0
    peak_cuda_allocated_bytes: int | None = None
    jumps_blind: int = 0  # cycle ends whose losses were too noisy for the verdict to judge a jump
    jumps_kept: int = 0
    data: dict[str, Any] | None = None  # DataRecord's: passes over the training data, its size and hash

    def to_dict(self) -> dict[str, Any]:
        keys = (
            "device",
            "steps",
            "backward_skipped_pct",
            "rollbacks",
            "segments_started",
            "peak_cuda_allocated_bytes",
            "jumps_blind",
            "jumps_kept",
            "data",
        )
        return {k: getattr(self, k) for k in keys} | self.curve.to_dict()


class DataRecord(L.Callback):
    """What a run reads, recorded as training starts: the passes over its training data that its ``max_steps``
    make, the training set's size and its SHA-256 (byte or word ids, where the set holds them). A run making more
    passes than its task declares (``cfg.benchmark``, set by ``compose_run``) is refused there, before it trains."""

    def __init__(self, task: str | None = None) -> None:
        self.task = task
        self.record: dict[str, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        batches = trainer.max_steps // max(1, len(trainer.optimizers))
        per_pass = trainer.num_training_batches
        passes = batches / per_pass if per_pass and per_pass != float("inf") else None
        train_set = getattr(trainer.datamodule, "train_set", None)
        ids = getattr(train_set, "ids", None)
        self.record = {"passes": passes, "batches_per_pass": per_pass, "train_items": _length(train_set)}
        if isinstance(ids, torch.Tensor):
            self.record |= {"train_tokens": ids.numel(), "sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest()}
        if self.task is not None and passes is not None:
            check_passes(self.task, passes)


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def fit_measured(cfg: Any, hybrid: bool, callbacks: list[Any] | None = None) -> tuple[Any, int | None]:
    """Build and fit one run; return its Trainer and, on a GPU, the fit's peak CUDA allocated bytes."""
    trainer, model, data, _ = build_run(cfg, hybrid, extra_callbacks=callbacks or [])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(model, data)
    cuda = trainer.strategy.root_device.type == "cuda"
    return trainer, torch.cuda.max_memory_allocated() if cuda else None


def fit(cfg: Any, hybrid: bool, stop: Any = None, callbacks: Sequence[Any] = ()) -> Record:
    recorder, data = CurveRecorder(cfg.monitor, stop), DataRecord(cfg.get("benchmark", {}).get("task"))
    trainer, peak = fit_measured(cfg, hybrid, [recorder, data, *callbacks])
    scheduler = find_scheduler(trainer)
    steps = trainer.global_step // max(1, len(trainer.optimizers))  # batches: a step per optimizer each
    record = Record(recorder.curve, trainer.strategy.root_device.type, steps, data=data.record)
    record.peak_cuda_allocated_bytes = peak
    if scheduler is not None:
        counters = scheduler.counters
        record.backward_skipped_pct = round(counters.backward_skipped_pct, 3)
        record.rollbacks, record.segments_started = counters.rollbacks, counters.predictions_made  # or jumps
        record.jumps_blind, record.jumps_kept = counters.jumps_blind, counters.jumps_kept
    return record


def compare_seed(baseline: Record, hybrid: Record, steps: int) -> dict[str, Any]:
    """Everything the report says about one seed; ``None`` wherever hybrid did not get there, and no time to
    target at all where plain's curve turned up at its end (``overfitting``: its final loss is no target)."""
    target = baseline.curve.points[-1].val_loss
    overfitting = overfits(baseline.curve.losses)
    result: dict[str, Any] = {"target": target, "to_target": {}, "loss_ratio_equal_time": {}}
    result |= {"overfitting": overfitting, "plain_rise": rise_at_end(baseline.curve.losses)}
    for axis in AXES:
        b = time_to_target(baseline.curve.axis(axis), baseline.curve.losses, target)
        h = time_to_target(hybrid.curve.axis(axis), hybrid.curve.losses, target)
        speedup = b / h if h and not overfitting else None
        result["to_target"][axis] = {"baseline": b, "hybrid": h, "speedup": speedup}
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
        cfg.trainer.max_steps = trainer_steps(task, max_steps)
    hybrid = fit(cfg, hybrid=True, stop=baseline_target(baseline, spec))
    clock = "wall_s" if baseline.device == "cuda" else "cpu_s"
    return {"seed": seed, "clock": clock} | compare_seed(baseline, hybrid, spec.steps)


def warm_up(task: str, spec: Length, overrides: list[str], workdir: str) -> None:
    """A discarded short run: one-time costs (lazy init, allocator, data setup) must not hit run 1 alone."""
    warm = compose_run(task, spec, 0, overrides, workdir)
    with open_dict(warm):
        warm.trainer.max_steps = warm.trainer.val_check_interval = min(20, spec.steps)
    fit(warm, hybrid=True)


def record_from(data: dict[str, Any]) -> Record:
    """A run record as a result file holds it."""
    curve = Curve([Point(**p) for p in data["points"]], [(Point(**a), Point(**b)) for a, b in data["segments"]])
    return Record(curve, data["device"], data["steps"], data["backward_skipped_pct"], data["rollbacks"])


def flag_overfitting(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (a ``run`` result file's) with every seed judged for overfitting and its summary made again: files
    written before the flag existed give time to target where plain's curve turned up."""
    for seed in result["seeds"]:
        losses = [p["val_loss"] for p in seed["baseline"]["points"]]
        seed["overfitting"], seed["plain_rise"] = overfits(losses), rise_at_end(losses)
        if seed["overfitting"]:
            for axis in seed["to_target"].values():
                axis["speedup"] = None
    return result | {"summary": summarize(result)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Median and range over seeds of each reported figure, on the seeds' headline clock."""
    seeds = result["seeds"]
    clock = seeds[0]["clock"]

    def spread(values: list[float | None]) -> dict[str, Any]:
        known = [v for v in values if v is not None]
        if not values or len(known) < len(values):
            return {"median": None, "min": None, "max": None, "missing": len(values) - len(known)}
        return {"median": statistics.median(known), "min": min(known), "max": max(known), "missing": 0}

    judged = [s for s in seeds if not s.get("overfitting")]  # plain's final loss is a target
    return {
        "clock": clock,
        "overfitting": len(seeds) - len(judged),
        "speedup": spread([s["to_target"][clock]["speedup"] for s in judged]),
        "backward_ratio": spread([s["to_target"]["backward"]["speedup"] for s in judged]),
        "loss_ratio_equal_steps": spread([s["loss_ratio_equal_steps"] for s in seeds]),
        "loss_ratio_equal_time": spread([s["loss_ratio_equal_time"][clock] for s in seeds]),
        "backward_skipped_pct": spread([s["hybrid"]["backward_skipped_pct"] for s in seeds]),
        "rollbacks": sum(s["hybrid"]["rollbacks"] for s in seeds),
        "hybrid_best_loss": spread([s["hybrid_best_loss"] for s in seeds]),
        "target": spread([s["target"] for s in seeds]),
    }


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# the process a run ran in: runs said to be paired in one process must name the same one
PROCESS = {"host": platform.node(), "pid": os.getpid(), "started": now()}


def stamp(started: str) -> dict[str, Any]:
    """What a result file keeps of where and when its run ran: the host and process, its start and its end."""
    return {"process": PROCESS, "started": started, "finished": now()}


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


# -- plain against the plugin, alternating -------------------------------------------------------------------
SETTLE = 4  # steps of each run left out of its steady-step time


class StepClock(L.Callback):
    """The steady step's time. On a CPU: the run meter's CPU time at the end of every training batch, and the median
    step after the first ``SETTLE``. On a GPU: wall time, synchronised only where that steady window starts and
    where training ends, and the window's mean step: the host runs ahead of the device as in any run, where a
    synchronisation every step would add the plugin's host time to the device's instead of overlapping them."""

    def __init__(self, meter: Any, cuda: bool) -> None:
        self.meter, self.cuda, self.marks, self.steps = meter, cuda, [], 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.steps += 1
        if not self.cuda:
            self.marks.append(self.meter.elapsed()[1])
        elif self.steps == SETTLE:
            torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

    def on_train_end(self, *args: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

    def steady_step(self) -> float:
        if self.cuda:
            return (self.marks[-1] - self.marks[0]) / (self.steps - SETTLE)
        return statistics.median(b - a for a, b in zip(self.marks[SETTLE:], self.marks[SETTLE + 1 :]))


def gpt_config(size: str, steps: int, workdir: str, extra: list[str]) -> Any:
    """The character GPT of ``size`` for ``steps`` of per-step prediction's `linear` (overridden by ``extra``),
    with no validation: what the overhead measurements time."""
    cfg = compose_run("char_gpt", "default", 0, [*SIZES[size], "predictor=linear", *extra], workdir)
    with open_dict(cfg):
        cfg.trainer.max_steps = cfg.model.max_steps = steps
        cfg.trainer.limit_val_batches = 0
    return cfg


def against_plain(
    size: str, steps: int, rounds: int, workdir: str, modes: dict[str, list[str]], common: Sequence[str] = ()
) -> dict[str, Any]:
    """Each mode's overrides and plain Lightning in turn, ``rounds`` times: the per-round ratios of
    training time, whole fit and steady steps, and what each hybrid run did (jumps, cycles too noisy to judge).
    ``common``: overrides of every run, plain's included (the trainer, its precision)."""
    times: dict[str, list[float]] = {"plain": [], **{mode: [] for mode in modes}}
    steady: dict[str, list[float]] = {label: [] for label in times}
    kept: dict[str, list[dict[str, int]]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for label in times:
            cfg = gpt_config(size, steps, workdir, [*common, *modes.get(label, [])])
            trainer, model, data, meter = build_run(cfg, hybrid=label != "plain")
            cuda = trainer.strategy.root_device.type == "cuda"
            clock = StepClock(meter, cuda)
            trainer.callbacks.append(clock)
            trainer.fit(model, data)
            times[label].append(meter.train_seconds if cuda else meter.train_cpu_seconds)
            steady[label].append(clock.steady_step())
            if label != "plain":
                c = find_scheduler(trainer).counters
                kept[label].append({"jumps": c.jumps_made, "blind": c.jumps_blind})
    ratios = {mode: [h / p for h, p in zip(times[mode], times["plain"])] for mode in modes}
    steady_ratios = {mode: [h / p for h, p in zip(steady[mode], steady["plain"])] for mode in modes}
    return {
        "clock": "wall_s" if cuda else "cpu_s",
        "steps": steps,
        "seconds": times,
        "hybrid_over_plain": {mode: statistics.median(r) for mode, r in ratios.items()},
        "ratios": ratios,
        "steady_step_seconds": steady,
        "steady_hybrid_over_plain": {mode: statistics.median(r) for mode, r in steady_ratios.items()},
        "steady_ratios": steady_ratios,
        "kept": kept,
    }


# -- result files --------------------------------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a rename, so that a benchmark running beside this one never reads half a
    file when it rewrites the table from every result in the folder."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)
