"""Where outer's state_on_host spends its time on a GPU: per-step wall times, synchronised (a one-off diagnostic,
run once on an H100 on 2026-11-26; its output is diag_onhost.json beside it)."""

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.gpu import HYBRID, MID, OUTER_CYCLES, OUTER_ON_HOST, Call
from lightning_hybrid.offload import HostHeld, host_like
from lightning_hybrid.runner import build_run

out = {}


class Clock(Callback):
    def __init__(self):
        self.t = []
        self.fit0 = None

    def on_fit_start(self, *a):
        torch.cuda.synchronize()
        self.fit0 = time.perf_counter()

    def on_train_batch_start(self, trainer, *a):
        torch.cuda.synchronize()
        self.t.append(time.perf_counter())


with tempfile.TemporaryDirectory() as d:
    call = Call(Path(d), False, time.monotonic() + 600, d)
    for rnd in range(2):
        for label, ov in (("outer", HYBRID["outer_norm_restart"]), ("on_host", OUTER_ON_HOST), ("plain", None)):
            clock = Clock()
            cfg = call.config("char_gpt", 200, [*MID, *(ov or []), *OUTER_CYCLES])
            trainer, model, data, _ = build_run(cfg, hybrid=ov is not None, extra_callbacks=[clock])
            t0 = time.perf_counter()
            trainer.fit(model, data)
            total = time.perf_counter() - t0
            steps = [b - a for a, b in zip(clock.t, clock.t[1:])]
            top = sorted(range(len(steps)), key=lambda i: -steps[i])[:8]
            out[f"{label}_{rnd}"] = {
                "fit_s": total,
                "to_first_batch_s": clock.t[0] - clock.fit0,
                "median_step_s": statistics.median(steps),
                "sum_steps_s": sum(steps),
                "slowest": [(i + 1, round(steps[i], 4)) for i in top],
            }
            print(label, rnd, json.dumps(out[f"{label}_{rnd}"]), flush=True)
    params = [p for p in model.parameters()]
    for name, make in (
        ("per_tensor", lambda: [host_like(p).zero_() for p in params]),
        ("flat", lambda: HostHeld(params).host),
    ):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = make()
        out[f"pin_{name}_s"] = time.perf_counter() - t0
        del x
    h = HostHeld(params)
    for i in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h.on_device()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        h.on_device(write=True)
        h.put_away()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        h.zero_()
        t3 = time.perf_counter()
        out[f"cycle_{i}"] = {"in_s": t1 - t0, "out_s": t2 - t1, "zero_s": t3 - t2}
    print(json.dumps({k: v for k, v in out.items() if k.startswith(("pin", "cycle"))}), flush=True)
Path(os.environ.get("OUT", "/tmp"), "diag_onhost.json").write_text(json.dumps(out, indent=1))
