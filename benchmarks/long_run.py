"""Memory over a long hybrid run: memory in use, live tensors and the parameters' addresses, sampled about every
250 steps (``--sample-every``) at the end of a Full step (Predict frees gradients, optimizer state and, with
``aggressive``, the update buffer, so samples are taken where the same buffers are alive).

    python -m benchmarks.long_run                                   # char GPT at 1M parameters, 3000 steps
    python -m benchmarks.long_run --task char_gpt_gpt2 --steps 1000 trainer=gpu      # on a GPU

Memory in use is the RSS on CPU and CUDA's allocated bytes on a GPU, where the run also measures the peak of
plain Lightning on the same model for comparison. Trailing arguments are app overrides.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import open_dict

from benchmarks.harness import PREDICTING, RESULTS, SIZES, fit_measured, machine
from benchmarks.tasks import compose_run
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.callbacks.memory import proc_status
from lightning_hybrid.phase import Phase


def live_tensors() -> int:
    gc.collect()
    with warnings.catch_warnings():  # gc also holds deprecated torch proxies, which warn when inspected
        warnings.simplefilter("ignore")
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


class MemorySampler(Callback):
    """Samples ``(memory in use, live tensors, parameter data_ptrs)`` at the end of the first Full step after
    every ``every`` steps."""

    def __init__(self, every: int = 250) -> None:
        self.every = every
        self.samples: dict[int, tuple[int, int, list[int]]] = {}
        self._next = every
        self._scheduler: Any = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._scheduler = find_scheduler(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step < self._next or self._scheduler.phase is not Phase.FULL:
            return
        self._next += self.every
        device = pl_module.device
        in_use = torch.cuda.memory_allocated(device) if device.type == "cuda" else proc_status("VmRSS")
        self.samples[step] = (in_use, live_tensors(), [p.data_ptr() for p in pl_module.parameters()])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="char_gpt", choices=("char_gpt", "char_gpt_gpt2"))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--sample-every", type=int, default=250, help="steps between samples (the suite's: 20)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<device>)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    size = SIZES["1M"] if args.task == "char_gpt" else []
    overrides = [*size, *PREDICTING, "hybrid.predict_memory=aggressive", "trainer.limit_val_batches=0"]
    with tempfile.TemporaryDirectory() as workdir:
        cfg = compose_run(args.task, "default", 0, [*overrides, *args.overrides], workdir)
        with open_dict(cfg):
            cfg.trainer.max_steps = cfg.model.max_steps = args.steps
        sampler = MemorySampler(args.sample_every)
        trainer, hybrid_peak = fit_measured(cfg, hybrid=True, callbacks=[sampler])
        plain_peak = fit_measured(cfg, hybrid=False)[1] if hybrid_peak is not None else None
    counters = find_scheduler(trainer).counters
    after = {s: v for s, v in sampler.samples.items() if s >= 500} or sampler.samples
    in_use, tensors = [v[0] for v in after.values()], [v[1] for v in after.values()]
    params = trainer.lightning_module.parameters()
    result = {
        "machine": machine(),
        "task": args.task,
        "steps": args.steps,
        "overrides": overrides + args.overrides,
        "counters": counters.to_dict(),
        "samples": {s: {"memory_in_use_bytes": v[0], "live_tensors": v[1]} for s, v in sampler.samples.items()},
        "memory_growth_after_step_500": max(in_use) / in_use[0] - 1,
        "live_tensors_range_after_step_500": [min(tensors), max(tensors)],
        "parameter_addresses_constant": len({tuple(v[2]) for v in sampler.samples.values()}) == 1,
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
    }
    if hybrid_peak is not None:
        result |= {"peak_cuda_allocated_hybrid": hybrid_peak, "peak_cuda_allocated_plain": plain_peak}
    out = args.out or RESULTS / ("cuda" if torch.cuda.is_available() else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"long_run_{args.task}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "counters")}, indent=1))
    return result


if __name__ == "__main__":
    main()
