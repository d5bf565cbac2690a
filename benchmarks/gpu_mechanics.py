"""The GPU command's mechanics checks, run when named (``python -m benchmarks.gpu --parts sync memory``): the suite's
CUDA tests, the rules' Triton kernels, memory along a long predicting run, the Predict phase's offload, the default
rule's device memory, ``16-mixed`` and FSDP over NCCL. Each takes the call (where results go, how small the runs are)
and returns its result."""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import open_dict

from benchmarks.harness import HYBRID, SIZES
from benchmarks.tasks import Length, compose_run

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
TINY_GPT = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "data.block_size=32", "data.max_bytes=20000"]
MID = SIZES["25M"]  # 25M parameters
PREDICTING = ["predictor=linear", "hybrid.warmup_steps=20", "hybrid.full_steps=10", "hybrid.confidence_threshold=0.0"]
PREDICTING += ["hybrid.predict_lr_fraction=1.0", "hybrid.max_consecutive_rollbacks=1000"]
PREDICTING += ["hybrid.bandit=false", "hybrid.backoff_after=0"]  # keep predicting: these parts measure its mechanics


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


def summary_of(cfg: Any, callbacks: list[Any] | None = None) -> dict[str, Any]:
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


def sync(call: Call) -> dict[str, Any]:
    """The suite's CUDA tests: 40 steps under ``torch.cuda.set_sync_debug_mode("error")``, quiet steps read nothing;
    ``outer``'s jumps with ``state_on_host`` (pinned memory, a side stream) the same as without; and ``linear``'s
    update average on the host between fits, back on the device in the next."""
    tests = ["tests/test_idle.py::test_quiet_steps_never_synchronise_on_cuda"]
    tests += ["tests/test_outer_on_host.py::test_jumps_with_state_on_host_match_jumps_without_on_every_device"]
    tests += [
        "tests/test_outer_on_host.py::test_the_default_keeps_the_state_on_the_device_and_goes_to_the_host_only_"
        "where_it_would_crowd_cuda"
    ]
    tests += ["tests/test_lightning_run.py::test_the_update_average_waits_on_the_host_between_fits_on_cuda"]
    return _pytest(tests)


def _pytest(tests: list[str]) -> dict[str, Any]:
    """The suite's ``tests`` in a process of their own: whether they passed, and the end of what pytest printed."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "--tb=short", *tests]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    return {"passed": done.returncode == 0, "output": done.stdout[-6000:]}


def kernels(call: Call) -> dict[str, Any]:
    """The rules' Triton kernels on a GPU, on by default there and run so far only in Triton's interpreter: the
    suite's fused tests (each kernel against the eager path and the float64 formula, fits that resume bitwise),
    then ``gpa``'s step on the 85M model's tensors timed eagerly and by its kernel."""
    tests = ["tests/test_outer_fused.py", "tests/test_outer_reference.py", "tests/test_gpa.py"]
    tests += ["tests/test_benchmarks.py::test_the_gpa_cost_driver_counts_the_fused_kernel_at_the_floor"]
    return _pytest(tests) | {"gpa_step_ms": _gpa_step_ms()}


def _gpa_step_ms(repeats: int = 20) -> dict[str, Any]:
    """Median milliseconds of one ``gpa`` step on the 85M model's tensors, eagerly and fused (synchronised)."""
    from benchmarks.gpa_cost import GPT2_SMALL, _averaging
    from lightning_hybrid.demos.char_gpt import CharGPT

    layers, width, heads = GPT2_SMALL
    model = CharGPT(n_layer=layers, n_head=heads, n_embd=width, block_size=256).cuda()
    out: dict[str, Any] = {}
    for fused in (False, True):
        rule, params = _averaging(model, fused=fused)
        kept, seconds = torch.ones((), device="cuda"), []
        for _ in range(repeats + 3):  # the first three warm up
            torch.cuda.synchronize()
            start = time.perf_counter()
            rule.average(params, kept)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        out["fused" if fused else "eager"] = {"median": statistics.median(seconds[3:]) * 1e3, "kernels": rule._kernels}
    return out


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
    summary = summary_of(cfg, [Watch()])
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
        summary = summary_of(cfg)
        out[mode] = {"predict_peak_bytes": (summary.get("memory_peak_bytes_by_phase") or {}).get("predict")}
    return out


OUTER_CYCLES = ["hybrid.warmup_steps=20", "hybrid.full_steps=20", "model.warmup_steps=10"]  # the rate's rise over
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

    dry_cycles = ["hybrid.warmup_steps=5", "hybrid.full_steps=10", "model.warmup_steps=0"]
    steps, cycles = (40, dry_cycles) if call.dry else (120, OUTER_CYCLES)
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
    summary = summary_of(cfg)
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


MECHANICS: dict[str, tuple[Callable[[Call], dict[str, Any]], float, str | None]] = {
    # name -> (what it runs, minutes it takes on a GPU, why it cannot run on the CPU)
    "sync": (sync, 1.0, "needs CUDA: torch.cuda.set_sync_debug_mode"),
    "kernels": (kernels, 2.0, "needs CUDA: the suite runs the kernels in Triton's interpreter where it has Triton"),
    "memory": (memory, 3.0, None),
    "offload": (offload, 1.5, None),
    "outer_memory": (outer_memory, 1.5, None),
    "fp16": (fp16, 1.0, "needs CUDA: 16-mixed and its GradScaler"),
    "fsdp": (fsdp, 2.0, "needs two CUDA devices and NCCL"),
}
