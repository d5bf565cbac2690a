"""Cost of each predictor's per-step work (observe + online training) relative to an ordinary training step.

    python -m benchmarks.predictor_overhead            # writes benchmarks/results/predictor_overhead.json

Both are timed in the same process on the example's byte-level GPT (0.44M parameters), in CPU time of this
process, in alternating blocks; the median of the per-block ratios is robust to other load on the machine.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

from lightning_hybrid.demos.char_gpt import CharGPT, StdlibText
from lightning_hybrid.encoder import StateEncoder
from lightning_hybrid.predictors import build_predictor

STEPS, BLOCKS = 64, 7


def _cpu_ms(fn, steps: int, offset: int) -> float:
    start = time.process_time()
    for i in range(offset, offset + steps):
        fn(i)
    return (time.process_time() - start) / steps * 1000


def _interleaved(ordinary, observe) -> tuple[float, float, float]:
    """Median ordinary-step and observe cost (ms) and the median of their per-block ratio; blocks alternate so
    load from other processes hits both."""
    steps, costs, ratios = [], [], []
    for block in range(BLOCKS):
        steps.append(_cpu_ms(ordinary, 8, 0))
        costs.append(_cpu_ms(observe, STEPS, 64 + block * STEPS))
        ratios.append(costs[-1] / steps[-1])
    return statistics.median(steps), statistics.median(costs), statistics.median(ratios)


def main() -> None:
    torch.manual_seed(0)
    data = StdlibText()
    data.setup("fit")
    model = CharGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [next(iter(data.train_dataloader())) for _ in range(1)]

    def ordinary(i: int) -> None:
        loss = model._loss(batches[0])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    ordinary(0)
    params = [[p for p in model.parameters()]]
    results = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    for name in ("linear", "mlp", "rssm"):
        predictor = build_predictor(name)
        encoder = StateEncoder()
        predictor.setup(params, encoder.dim)
        deltas = [[torch.randn_like(p) * 1e-3 for p in params[0]]]

        def observe(i: int, predictor=predictor, encoder=encoder, deltas=deltas) -> None:
            features = encoder.features()
            stats = predictor.observe(i, 2.0 - 1e-3 * i, deltas, features)
            encoder.observe(i, 2.0 - 1e-3 * i, 1.0, [1e-3], stats.actual_sq if stats else None)

        for i in range(64):  # fill the replay buffers so training steps run
            observe(i)
        step_ms, cost, share = _interleaved(ordinary, observe)
        results[name] = {"ordinary_step_ms": round(step_ms, 3), "observe_ms": round(cost, 3), "share": round(share, 4)}
        print(f"{name:6s} observe+train {cost:7.3f} ms = {100 * share:5.2f}% of an ordinary step ({step_ms:.1f} ms)")
    out = Path(__file__).parent / "results" / "predictor_overhead.json"
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
