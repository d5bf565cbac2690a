"""What primal averaging (``gpa``) costs a step, apart from the step itself: the operations of one averaging step on
the 85M model's tensors (12 layers, 768 wide), their CPU time, the bytes they move and the memory the rule holds;
and, from those bytes, an estimate for one H200, where plain's step at 85M took a measured 23-29 ms.

    python -m benchmarks.gpa_cost        # benchmarks/results/gpa_cost/README.md and gpa_cost.json

The bytes moved: each of the step's ``_foreach_`` operations reads and writes whole parameter lists (``TRAFFIC``:
how many lists each touches). The estimate divides them by the GPU's memory bandwidth: a lower bound on its time,
which launch overheads (a few microseconds a kernel) add to.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from benchmarks.harness import RESULTS, machine, write_atomic
from benchmarks.jump_cost import Count
from lightning_hybrid.demos.char_gpt import CharGPT
from lightning_hybrid.predictors import PrimalAveraging

OUT = RESULTS / "gpa_cost"
# parameter lists each operation of ``PrimalAveraging.average`` reads and writes: add (p, z -> p), add (p, x -> p),
# mul (p -> p), add (z, p -> z), lerp (x, z -> x), copy (z -> p), lerp (p, x -> p)
TRAFFIC = (3, 3, 2, 3, 3, 2, 3)
H200_BANDWIDTH = 4.8e12  # bytes a second, the H200's HBM3e as NVIDIA states it
PLAIN_STEP_85M = (0.0232, 0.0286)  # seconds, plain's steady step at 85M on one H200 (gpu/2026-11-27, 3 rounds)


def measure(repeats: int = 5) -> dict:
    torch.manual_seed(0)
    model = CharGPT(n_layer=12, n_head=12, n_embd=768, block_size=256)
    params = [p for p in model.parameters() if p.requires_grad]
    rule = PrimalAveraging()
    rule.setup(params, keep_jump=False)
    rule.start(params)
    kept = torch.ones(())
    with torch.no_grad():
        torch._foreach_add_(params, 1e-3)  # an optimizer step's update
    count = Count()
    with count:
        rule.average(params, kept)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        rule.average(params, kept)
        seconds.append(time.perf_counter() - start)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    moved = sum(TRAFFIC) * param_bytes
    gpu = moved / H200_BANDWIDTH
    return {
        "machine": machine(),
        "parameters": sum(p.numel() for p in params),
        "tensors": len(params),
        "ops": count.ops,
        "foreach_ops": count.foreach,
        "host_reads": count.reads,
        "cpu_seconds": {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)},
        "state_bytes": 2 * param_bytes,
        "state_in_parameter_copies": 2,
        "bytes_moved": moved,
        "h200_seconds_at_bandwidth": gpu,
        "share_of_plain_step_85m": [gpu / s for s in PLAIN_STEP_85M[::-1]],
    }


def to_markdown(r: dict) -> str:
    low, high = r["share_of_plain_step_85m"]
    return (
        "# What primal averaging costs a step\n\n"
        + __doc__.split("\n\n")[0]
        + f"\n\nMade by `python -m benchmarks.gpa_cost`.\n\n"
        f"- The 85M model: {r['parameters'] / 1e6:.1f}M parameters in {r['tensors']} tensors.\n"
        f"- One averaging step: {r['ops']} operations, {r['foreach_ops']} of them fused `_foreach_` ones, "
        f"{r['host_reads']} reads to the host.\n"
        f"- Its CPU time (one thread): {r['cpu_seconds']['median'] * 1e3:.0f} ms "
        f"({r['cpu_seconds']['min'] * 1e3:.0f}-{r['cpu_seconds']['max'] * 1e3:.0f}).\n"
        f"- Memory it holds: {r['state_in_parameter_copies']} parameter copies, "
        f"{r['state_bytes'] / 1e6:.0f} MB.\n"
        f"- Bytes it moves: {r['bytes_moved'] / 1e9:.2f} GB a step; at an H200's {H200_BANDWIDTH / 1e12:.1f} TB/s, "
        f"at least {r['h200_seconds_at_bandwidth'] * 1e3:.2f} ms: {low:.1%}-{high:.1%} of plain's 85M step there "
        "(the aim: at most 1%).\n"
    )


def main() -> None:
    torch.set_num_threads(1)
    result = measure()
    OUT.mkdir(parents=True, exist_ok=True)
    write_atomic(OUT / "gpa_cost.json", json.dumps(result, indent=1))
    text = to_markdown(result)
    write_atomic(OUT / "README.md", text)
    print(text)


if __name__ == "__main__":
    main()
