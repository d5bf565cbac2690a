"""What a jump of the default rule costs, apart from the steps around it: each cycle's end (the verdict, the restart
check, the decision) and each jump, timed alone, with the tensor operations and host reads each makes. The GPU
command's ``profile`` part runs it at 85M on the GPU, and in its dry run on the CPU on the GPT-2 shape at width 16
(``SMALL_GPT2``: the 85M model's 149 tensors; the counts depend on the number of tensors, not their size).

The default rule jumps every cycle (``verify_resolution=0``, cycles of 20 after a 20-step warmup). Per cycle end and
per jump, medians over the run:

- ``ops``: torch's dispatcher's operations (on a GPU each is a kernel launch or a host-side op; a ``_foreach_`` op
  launches one kernel per few dozen tensors); ``foreach_ops`` of them;
- ``host_reads``: ``.item()`` and ``.tolist()`` calls and copies to the host: each waits, on a GPU, for every
  kernel queued before it;
- ``ms``: wall time, synchronised before and after on a GPU, in a second run without the counting (whose Python
  would be timed too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from benchmarks.harness import RESULTS, gpt_config, machine, write_atomic
from benchmarks.tasks import GPT2_SHAPE
from lightning_hybrid.engine.families.jumps import OuterJumps
from lightning_hybrid.predictors import fused_blocks, outer_fused
from lightning_hybrid.runner import build_run

# a jump every cycle of 20 steps after 20; the rate's warm-up ends before the first (no jump is made on a rising rate)
JUMPING = ["predictor=outer", "predictor.verify_resolution=0", "hybrid.warmup_steps=20", "hybrid.full_steps=20"]
JUMPING += ["model.warmup_steps=10"]
SMALL_GPT2 = [*GPT2_SHAPE, "model.n_embd=16", "model.n_head=2", "data.block_size=16", "data.batch_size=4"]
TIMED = {"cycle_end": "cycle_end", "jump": "_jump"}  # what is reported -> OuterJumps' method


class Count(TorchDispatchMode):
    """Counts the operations dispatched, the ``_foreach_`` ones and the reads to the host among them, and the bytes
    they move: each operation reads its tensor arguments once and writes its results, or the argument it updates in
    place, once; a copy's target is written, not read."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.foreach = self.reads = self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        name = func.__name__
        self.foreach += name.startswith("_foreach_")
        to_host = name.startswith(("_to_copy", "copy_")) and _to_host(func, args, kwargs or {})
        self.reads += name.startswith("_local_scalar_dense") or to_host
        out = func(*args, **(kwargs or {}))
        in_place = name.split(".")[0].endswith("_")
        written = args[0] if out is None and in_place else out  # in-place foreach ops return nothing
        read = args[1:] if name.startswith(("copy_", "_foreach_copy_")) else args
        self.bytes += _bytes((read, kwargs)) + _bytes(written)
        return out


def _bytes(tree: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def _to_host(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a copy brings a device tensor to the host (never on a CPU, where the host is the device)."""
    source = args[1] if func.__name__.startswith("copy_") else args[0]
    target = args[0].device if func.__name__.startswith("copy_") else kwargs.get("device")
    return isinstance(source, torch.Tensor) and source.device.type != "cpu" and str(target).startswith("cpu")


@contextmanager
def _counting_tolist(count: Count) -> Iterator[None]:
    """``Tensor.tolist`` on a CPU tensor dispatches nothing: count its calls as host reads."""
    original = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        count.reads += self.device.type == "cpu"
        return original(self)

    torch.Tensor.tolist = tolist
    try:
        yield
    finally:
        torch.Tensor.tolist = original


# the fused jump's kernels (lightning_hybrid.predictors.outer_fused), which the dispatcher does not see: the
# parameter-sized rows each reads and writes, from its flags; its small tensors are counted as read once
KernelRows = dict[str, Callable[[dict[str, bool]], tuple[int, int]]]
KERNEL_ROWS: KernelRows = {
    "_sums_kernel": lambda flags: (2 + flags["HAS_B"], 0),
    "_reduce_kernel": lambda flags: (0, 0),
    "_write_kernel": lambda flags: (2 + flags["HAS_B"], 2 + flags["HAS_B"] + flags["KEEP"]),
}


def _elements(numels: Any) -> int:
    """The elements of the tensors a launch's table points at: those of the kept launch whose sizes it passes."""
    return next((sum(key[1]) for key, kept in fused_blocks._blocks.items() if kept.numels is numels), 0)


@contextmanager
def counting_kernels(count: Count, module: Any = outer_fused, rows: KernelRows = KERNEL_ROWS) -> Iterator[None]:
    """Each launch of one of ``module``'s kernels counted as one operation, with the bytes its loads and stores
    move (``rows``; the launch's fourth argument holds its tensors' sizes)."""
    originals = {name: getattr(module, name, None) for name in rows}

    def counted(name: str, kernel: Any) -> Any:
        class Launches:
            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                def launch(*args: Any, **flags: Any) -> Any:
                    reads, writes = rows[name](flags)
                    count.ops += 1
                    count.bytes += (reads + writes) * _elements(args[3]) * 4 + _bytes(args)
                    with _disable_current_modes():  # Triton's interpreter copies the arguments: not the kernel's
                        return kernel[grid](*args, **flags)

                return launch

        return Launches()

    for name, kernel in originals.items():
        if kernel is not None:
            setattr(module, name, counted(name, kernel))
    try:
        yield
    finally:
        for name, kernel in originals.items():
            if kernel is not None:
                setattr(module, name, kernel)


def kernels_here() -> None:
    """Let the fused kernels run on this machine: on CUDA, or on a CPU in Triton's interpreter; else say why not."""
    if fused_blocks.triton is None:
        raise SystemExit("--fused counts the fused kernels: install Triton (on a CPU, run it with TRITON_INTERPRET=1)")
    if not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--fused on a CPU runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
        fused_blocks.DEVICE_TYPES.add("cpu")


@contextmanager
def timed_jumps(counting: bool) -> Iterator[dict[str, list[dict[str, float]]]]:
    """While open, every cycle end and jump of the default rule is recorded: counted (``counting``) or timed."""
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in TIMED}
    originals = {name: getattr(OuterJumps, method) for name, method in TIMED.items()}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(self: OuterJumps, *args: Any) -> Any:
            if counting:
                count = Count()
                with count, _counting_tolist(count), counting_kernels(count):
                    out = fn(self, *args)
                counted = {"ops": count.ops, "foreach_ops": count.foreach, "host_reads": count.reads}
                seen[name].append(counted | {"bytes": count.bytes})
                return out
            cuda = self.engine.store.params[0].is_cuda
            _synchronize(cuda)
            start = time.perf_counter()
            out = fn(self, *args)
            _synchronize(cuda)
            seen[name].append({"ms": (time.perf_counter() - start) * 1e3})
            return out

        return recorded

    for name, method in TIMED.items():
        setattr(OuterJumps, method, wrap(name, originals[name]))
    try:
        yield seen
    finally:
        for name, method in TIMED.items():
            setattr(OuterJumps, method, originals[name])


class BusyWindow(L.Callback):
    """Profiles ``steps`` training steps from ``start`` (torch.profiler, CUDA activity where there is a GPU): the
    device's busy time (kernels and copies) against the window's wall time, synchronised at both ends, and the
    kernel launches and host synchronisations the host made in it."""

    def __init__(self, start: int, steps: int) -> None:
        self.start, self.steps = start, steps
        self.result: dict[str, Any] = {}
        self._profile: torch.profiler.profile | None = None
        self._began = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step != self.start:
            return
        cuda = trainer.strategy.root_device.type == "cuda"
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        self._profile = torch.profiler.profile(activities=activities)
        _synchronize(cuda)
        self._profile.__enter__()
        self._began = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._profile is None or trainer.global_step != self.start + self.steps:
            return
        _synchronize(trainer.strategy.root_device.type == "cuda")
        wall = time.perf_counter() - self._began
        self._profile.__exit__(None, None, None)
        events = self._profile.events()
        busy = device_busy_s(events)
        names = [e.name for e in events if e.device_type == DeviceType.CPU]
        self.result = {
            "steps": self.steps,
            "wall_s": wall,
            "device_busy_s": busy,
            "busy_share": busy / wall,
            "kernel_launches": sum(n.startswith("cudaLaunchKernel") for n in names),
            "host_synchronisations": sum("Synchronize" in n for n in names),
        }
        self._profile = None


def device_busy_s(events: Any) -> float:
    """Seconds the device spent in kernels and copies: its events less the profiler's GPU annotations (an
    ``Optimizer.step`` range, say), which span the kernels they hold and would count them twice."""
    kernels = (e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation)
    return sum(e.device_time_total for e in kernels) / 1e6


def _synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure(cfg: Any, busy: BusyWindow | None = None, timed: bool = True) -> dict[str, Any]:
    """Two fits of ``cfg``: one counting each cycle end's and jump's operations, one timing them (and profiling
    ``busy``'s window; not run without ``timed``); medians."""
    out: dict[str, Any] = {}
    for counting in (True, False) if timed else (True,):
        profiled = [busy] if busy is not None and not counting else []
        with timed_jumps(counting) as seen:
            trainer, model, data, _ = build_run(cfg, hybrid=True, extra_callbacks=profiled)
            trainer.fit(model, data)
        for name, calls in seen.items():
            figures = out.setdefault(name, {"calls": len(calls)})
            for key in calls[0] if calls else ():
                figures[key] = statistics.median(c[key] for c in calls)
            if not counting and calls:
                figures["ms_max"] = max(c["ms"] for c in calls)
    trained = [p for p in model.parameters() if p.requires_grad]
    out["tensors"], out["parameter_bytes"] = len(trained), sum(p.numel() * p.element_size() for p in trained)
    for name in TIMED:
        if "bytes" in out[name]:  # in copies of the parameters, against the floor a cycle end and its jump need
            out[name]["parameter_copies"] = out[name]["bytes"] / out["parameter_bytes"]
    return out | ({"busy": busy.result} if busy else {})


# What a cycle's end and its jump must move at least, in parameter copies: read the weights, the anchor and the
# momentum once, write the weights, the momentum, the anchor and the jump kept for an undo once.
FLOOR_COPIES = 7
BYTES_OUT = RESULTS / "jump_cost" / "bytes.json"


FUSED_OUT = RESULTS / "jump_cost" / "fused_bytes.json"


def main(argv: list[str] | None = None) -> None:
    """The bytes a cycle's end and a jump move, counted on the CPU on the char GPT at 3.3M (4 layers, 256 wide), the
    default jumping every 20 steps: ``benchmarks/results/jump_cost/bytes.json``; with ``--fused``, the fused
    kernels' jumps over 102 steps (3 jumps), on a CPU in Triton's interpreter (``TRITON_INTERPRET=1``):
    ``fused_bytes.json``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--fused", action="store_true", help="count the fused jump (needs Triton)")
    fused = parser.parse_args(argv).fused
    if fused:
        kernels_here()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as workdir:
        size = ["model.n_layer=4", "model.n_embd=256", "model.n_head=8"]
        cfg = gpt_config(
            "1M",
            102 if fused else 62,
            workdir,
            [*size, *JUMPING, *(["trainer=gpu"] if fused and torch.cuda.is_available() else [])],
        )
        counted = measure(cfg, timed=False)
    copies = counted["cycle_end"]["parameter_copies"] + counted["jump"]["parameter_copies"]
    result = counted | {"floor_copies": FLOOR_COPIES, "over_floor": copies / FLOOR_COPIES, "machine": machine()}
    write_atomic(FUSED_OUT if fused else BYTES_OUT, json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
