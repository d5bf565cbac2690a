"""The plugin's host work per step (issue 50): its Python, measured where the model does almost nothing.

    python -m benchmarks.host_work                          # 1000 steps, 7 rounds: benchmarks/results/host_work/
    python -m benchmarks.host_work --steps 160 --rounds 1 --out host_work_quick   # a quick look

A tiny MLP (32 -> 64 -> 10, batch 8, AdamW) on fixed batches, one torch thread: a step of plain Lightning costs a
few hundred microseconds, so what the plugin adds is its own host work, which on a GPU is wall time unless the
device's step hides it. The plugin is ``HybridScheduler`` beside Lightning's own strategy (the per-step mode: beside
the hybrid one). Plain Lightning and each mode alternate in pairs in this process, ``--rounds`` times. A callback
listed last reads the process's CPU time at every batch end, so a step's time brackets every callback's hooks.
Per mode and round: the median step above plain's median step of the pair, in microseconds, over

- ``quiet``: steps that neither make a jump nor end a cycle (the default between jumps);
- ``cycle``: the mean over all steps after warmup, against plain's mean over the same steps, so a jump and a
  cycle's end are amortised over the cycle;

then the median and range over rounds. Modes: the default stepping aside (a limit no cycle meets: no cycle judged,
no jump), the default judging and jumping every cycle (with AdamW as it is, which every ordinary step must read
to the host to skip a non-finite update, and fused, which skips it on the device so that quiet steps read nothing),
the default stepping aside with a TensorBoard logger logging every step (every other mode runs with no logger), and
the per-step mode backed off and tracking every update.
Times on a shared machine spread widely, so three figures that hardly vary stand beside them: the plugin's own time
per step (:class:`OwnTime`, over whole runs: median and range of three) and, per step above plain over a whole run
of each mode, the Python function calls (a profile's) and the tensor operations (torch's dispatcher's; on a GPU each
is a kernel launch or a host-side op). A profile of one run of the default, its top entries by the plugin's own
time, closes the report.
Not a timed test: the suite runs it at a few steps only so that it cannot rot.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loops.optimization.automatic import Closure
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import Strategy
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

import lightning_hybrid.engine.step_hooks as step_hooks
from benchmarks.harness import RESULTS, machine, write_atomic
from lightning_hybrid import HybridPredictStrategy
from lightning_hybrid.callbacks.scheduler import HybridScheduler
from lightning_hybrid.engine.step_hooks import StepHooks
from lightning_hybrid.step_routing import StepRouting

OUT = RESULTS / "host_work"
# mode -> hybrid_callbacks settings, and the run's options: `fused` (the optimizer's), `logged` (a TensorBoard logger)
MODES: dict[str, dict[str, Any]] = {
    "default_aside": {"verify_resolution": 1e-12},
    "default_jumping": {"verify_resolution": 0.0},
    "default_jumping_fused": {"verify_resolution": 0.0, "fused": True},  # quiet steps guarded on the device
    "default_aside_logged": {"verify_resolution": 1e-12, "logged": True},  # every step a logging step
    "per_step_backed_off": {"predictor": "linear", "enable_prediction": False},
    "per_step_tracking": {"predictor": "linear", "confidence_threshold": 1.0, "backoff_after": 0},
}
BRACKETED_PLUGIN = {
    HybridScheduler: ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end"),
    StepHooks: ("_before", "_after"),
    step_hooks: ("_then_guarded",),
    StepRouting: ("training_step", "backward", "optimizer_step"),
}
BRACKETED_LIGHTNING = {
    Strategy: ("training_step", "backward", "optimizer_step"),
    Precision: ("_wrap_closure",),
    Closure: ("__call__",),
}
GOALS_US = {"default_aside": 50, "default_jumping": 100, "per_step_backed_off": 100}


class TinyMLP(L.LightningModule):
    def __init__(self, fused: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.fused = fused

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=self.fused or None)


class BatchEndStamps(L.Callback):
    """The process's CPU time at every batch end: the differences are whole steps, every callback's hooks in."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.stamps.append(time.process_time())

    def steps_us(self) -> list[float]:
        """Step ``i`` (0-based, from the second) took ``steps_us()[i - 1]`` microseconds."""
        return [(b - a) * 1e6 for a, b in zip(self.stamps, self.stamps[1:])]


def _fit(steps: int, settings: dict[str, Any] | None, options: dict[str, bool]) -> tuple[list[float], Any]:
    """One run; ``options``: ``fused`` (the optimizer), ``logged`` (a TensorBoard logger, every step logged)."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8 * steps, 32), torch.randint(0, 10, (8 * steps,)))
    clock = BatchEndStamps()
    hybrid = [] if settings is None else [HybridScheduler(**settings)]
    per_step = settings is not None and settings.get("predictor") == "linear"  # the hybrid strategy's own mode
    with tempfile.TemporaryDirectory() as logs:
        logger = TensorBoardLogger(logs) if options.get("logged") else False
        trainer = L.Trainer(
            max_steps=steps, accelerator="cpu", logger=logger, log_every_n_steps=1, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[*hybrid, clock],
            strategy=HybridPredictStrategy() if per_step else "auto",
        )  # fmt: skip
        trainer.fit(TinyMLP(options.get("fused", False)), DataLoader(data, batch_size=8))
    return clock.steps_us(), hybrid[0].config if hybrid else None


def _split(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    """A mode's plugin settings, and the run's options (which plain of its pair shares)."""
    options = {k: settings[k] for k in ("fused", "logged") if k in settings}
    return {k: v for k, v in settings.items() if k not in options}, options


def _positions(steps: int, config: Any) -> tuple[list[int], list[int]]:
    """Indices (into ``steps_us``, step ``i + 2``) of the quiet steps and of all steps after warmup."""
    after = [i for i in range(steps - 1) if i + 2 > config.warmup_steps]
    quiet = [i for i in after if (i + 2 - config.warmup_steps) % config.full_steps not in (0, 1)]
    return quiet, after


def measure(steps: int, rounds: int) -> dict[str, Any]:
    above: dict[str, dict[str, list[float]]] = {m: {"quiet": [], "cycle": []} for m in MODES}
    plain_us: list[float] = []
    for _ in range(rounds):
        for mode, both in MODES.items():  # each mode right after its own plain run: load drifts between pairs
            settings, options = _split(both)  # plain of the pair steps the same optimizer, with the same logger
            plain = _fit(steps, None, options)[0]
            plain_us.append(statistics.median(plain[10:]))
            times, config = _fit(steps, settings, options)
            quiet, after = _positions(steps, config)
            above[mode]["quiet"].append(statistics.median([times[i] for i in quiet]) - plain_us[-1])
            above[mode]["cycle"].append(statistics.fmean([times[i] - plain[i] for i in after]))
    return {"plain_step_us": _spread(plain_us), "above_plain_us": {m: {k: _spread(v) for k, v in a.items()}
                                                                   for m, a in above.items()}}  # fmt: skip


def _spread(values: list[float], each: str = "rounds") -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), each: values}


class OwnTime:
    """The plugin's own time: while it is on, each moment goes to the innermost bracketed function running, either
    one of the plugin's entry points (the scheduler's hooks, its optimizer step hooks and the closure they wrap, a
    hybrid strategy's three overrides) or one of Lightning's methods the plugin calls back into (the parent
    strategy's step methods, Lightning's closure), and the moments in the plugin's are summed. Unlike a difference of
    two runs it does not move with the machine's load; it leaves out Lightning's dispatch of the plugin's hooks (a
    few µs)."""

    def __init__(
        self, plugin: dict[type, tuple[str, ...]] | None = None, lightning: dict[type, tuple[str, ...]] | None = None
    ) -> None:
        self.bracketed = {True: plugin or BRACKETED_PLUGIN, False: lightning or BRACKETED_LIGHTNING}
        self.inside: list[bool] = []  # the bracketed functions running, innermost last: the plugin's (True)?
        self.mark = 0
        self.plugin_ns = 0
        self._patched: list[tuple[type, str, Any]] = []

    def _switch(self) -> None:
        now = time.perf_counter_ns()
        if self.inside and self.inside[-1]:
            self.plugin_ns += now - self.mark
        self.mark = now

    def _bracket(self, owner: type, name: str, plugin: bool) -> None:
        function = owner.__dict__[name]

        def bracketed(*args: Any, **kwargs: Any) -> Any:
            self._switch()
            self.inside.append(plugin)
            try:
                return function(*args, **kwargs)
            finally:
                self._switch()
                self.inside.pop()

        self._patched.append((owner, name, function))
        setattr(owner, name, bracketed)

    def __enter__(self) -> OwnTime:
        for plugin, functions in self.bracketed.items():
            for owner, names in functions.items():
                for name in names:
                    self._bracket(owner, name, plugin)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, function in reversed(self._patched):
            setattr(owner, name, function)


def own_us(steps: int, settings: dict[str, Any], options: dict[str, bool]) -> float:
    """The plugin's own time per step over one run (:class:`OwnTime`), after a run that warms the code up."""
    _fit(steps // 4, settings, options)
    with OwnTime() as own:
        _fit(steps, settings, options)
    return own.plugin_ns / steps / 1e3


class OpCount(TorchDispatchMode):
    """Counts the tensor operations torch's dispatcher runs while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _counted(steps: int, settings: dict[str, Any] | None, options: dict[str, bool]) -> tuple[int, int]:
    """Python calls and tensor operations over one run."""
    profiler = cProfile.Profile()
    profiler.enable()
    _fit(steps, settings, options)
    profiler.disable()
    with OpCount() as count:
        _fit(steps, settings, options)
    return sum(v[1] for v in pstats.Stats(profiler).stats.values()), count.ops


def call_depth(steps: int, settings: dict[str, Any], options: dict[str, bool]) -> float:
    """How deep the plugin's own calls nest on a quiet step: the most of its frames on the stack at once, the median
    over a run's quiet steps."""
    start, deepest, step = HybridScheduler.on_train_batch_start.__code__, {}, [0]

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        step[0] += frame.f_code is start
        depth, outer = 0, frame
        while outer is not None:
            depth += "lightning_hybrid" in outer.f_code.co_filename
            outer = outer.f_back
        deepest[step[0]] = max(deepest.get(step[0], 0), depth)

    sys.setprofile(watch)
    try:
        config = _fit(steps, settings, options)[1]
    finally:
        sys.setprofile(None)
    return statistics.median(deepest.get(i + 2, 0) for i in _positions(steps, config)[0])


def counts(steps: int, repeats: int = 3) -> dict[str, dict[str, Any]]:
    """Per mode: Python calls and tensor operations per step above plain's, over a whole run, the plugin's own
    time per step over ``repeats`` runs, and how deep its calls nest on a quiet step."""
    out = {}
    for mode, both in MODES.items():
        settings, options = _split(both)
        plain, hybrid = _counted(steps, None, options), _counted(steps, settings, options)
        own = [own_us(steps, settings, options) for _ in range(repeats)]
        out[mode] = {
            "python_calls": (hybrid[0] - plain[0]) / steps,
            "tensor_ops": (hybrid[1] - plain[1]) / steps,
            "own_us": _spread(own, "runs"),
            "call_depth": call_depth(min(steps, 120), settings, options),
        }
    return out


def profile(steps: int, top: int = 12) -> list[dict[str, Any]]:
    """The plugin's functions with the most time of their own over one run of the default (jumping)."""
    profiler = cProfile.Profile()
    profiler.enable()
    _fit(steps, MODES["default_jumping"], {})
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = [
        {
            "function": f"{Path(file).name}:{line} {name}",
            "calls": calls,
            "own_ms": own * 1e3,
            "with_callees_ms": cum * 1e3,
        }
        for (file, line, name), (_, calls, own, cum, _) in stats.items()
        if "lightning_hybrid" in file
    ]
    return sorted(rows, key=lambda r: -r["own_ms"])[:top]


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "| mode | quiet step, µs above plain | a cycle's steps on average, µs above plain | goal | the plugin's own "
        "time, µs a step | Python calls a step above plain | tensor ops a step above plain | call depth, quiet |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, parts in result["above_plain_us"].items():
        cells = [f"{p['median']:.0f} ({p['min']:.0f} to {p['max']:.0f})" for p in (parts["quiet"], parts["cycle"])]
        count = result["counts"][mode]
        own = count["own_us"]
        rows.append(
            f"| {mode} | {cells[0]} | {cells[1]} | {GOALS_US.get(mode, '-')} | {own['median']:.0f} ({own['min']:.0f} "
            f"to {own['max']:.0f}) | {count['python_calls']:.0f} | {count['tensor_ops']:.1f} "
            f"| {count['call_depth']:.0f} |"
        )
    plain = result["plain_step_us"]
    top = "\n".join(f"| {r['function']} | {r['calls']} | {r['own_ms']:.1f} | {r['with_callees_ms']:.1f} |"
                    for r in result["profile"])  # fmt: skip
    command = f"python -m benchmarks.host_work --steps {result['steps']} --rounds {result['rounds']}"
    return (
        f"# Host work per step\n\n`{command}`"
        f" ({result['date']}; {result['machine']['processor']}, torch {result['machine']['torch']}, one thread). "
        f"Plain Lightning's step: {plain['median']:.0f} µs ({plain['min']:.0f} to {plain['max']:.0f}). Medians over "
        "rounds, ranges in brackets; the module's docstring says how.\n\n"
        + "\n".join(rows)
        + "\n\nProfile of one run of the default (jumping), the plugin's functions by their own time:\n\n"
        "| function | calls | own ms | with callees ms |\n|---|---|---|---|\n" + top + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {"steps": args.steps, "rounds": args.rounds, "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    result |= {**measure(args.steps, args.rounds), "counts": counts(args.steps), "profile": profile(args.steps)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "host_work.json", json.dumps(result, indent=1))
    write_atomic(args.out / "README.md", markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
