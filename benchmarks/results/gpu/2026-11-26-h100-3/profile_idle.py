"""Where the plugin's per-step time goes when it never predicts (backed off), on a GPU: plain and backed-off runs
alternating (25M parameters, 300 steps), the last backed-off one under cProfile (a one-off diagnostic, run once on
an H100 on 2026-11-26; its output is profile_idle.txt beside it)."""

import cProfile
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.overheads import _config
from lightning_hybrid.runner import build_run

STEPS = 300
MODES = {"plain": None, "backed_off": ["hybrid.enable_prediction=false"]}
report = io.StringIO()
with tempfile.TemporaryDirectory() as workdir:
    for round_ in range(3):
        for label, extra in MODES.items():
            cfg = _config("25M", STEPS, workdir, extra or [])
            trainer, model, data, _ = build_run(cfg, hybrid=extra is not None)
            profile = cProfile.Profile() if round_ == 2 else None
            torch.cuda.synchronize()
            started = time.perf_counter()
            if profile:
                profile.enable()
            trainer.fit(model, data)
            torch.cuda.synchronize()
            if profile:
                profile.disable()
            print(f"round {round_} {label}: {time.perf_counter() - started:.3f} s", file=report, flush=True)
            if profile:
                stats = pstats.Stats(profile, stream=report)
                stats.sort_stats("tottime").print_stats(40)
                stats.sort_stats("cumulative").print_stats(r"lightning_hybrid|lightning/pytorch/(loops|core)", 40)
print(report.getvalue()[:3000])
Path(os.environ.get("OUT", "/tmp"), "profile_idle.txt").write_text(report.getvalue())
