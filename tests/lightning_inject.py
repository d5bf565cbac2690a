"""A pytest plugin that runs Lightning's own test suite with the plugin inside: every ``Trainer`` built with the
default strategy on one CPU device gets ``HybridPredictStrategy()`` and ``hybrid_callbacks(...)``.

    cd <lightning checkout>/tests && PYTHONPATH=<this checkout> HYBRID_INJECT=default \\
        python -m pytest -p tests.lightning_inject tests_pytorch/models/test_hooks.py

The 13 modules the record's counts come from (632 pass plain, 615 with the defaults:
``benchmarks/results/lightning_tests/``), under ``tests_pytorch/``:
``models/test_hooks.py tuner/test_lr_finder.py checkpointing/test_model_checkpoint.py
trainer/optimization/test_optimizers.py trainer/optimization/test_manual_optimization.py callbacks/test_lr_monitor.py
callbacks/test_stochastic_weight_avg.py trainer/connectors/test_callback_connector.py loops/test_loops.py
callbacks/test_early_stopping.py callbacks/test_weight_averaging.py trainer/test_trainer.py
loops/test_training_loop.py``.

``HYBRID_INJECT`` picks the settings: ``default`` (the defaults), ``jumps`` (the default rule jumping every 2 steps,
judged over 1, with no limit on the verdict's sight), ``linear`` (the per-step mode) or ``off`` (nothing injected:
the plain baseline). ``HYBRID_ALONE=1`` leaves every Trainer its own strategy and adds the plugin as one callback,
``HybridScheduler(...)``, whatever the strategy or devices. Not collected by this project's suite (no ``test_``
prefix)."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_hybrid import HybridPredictStrategy, HybridScheduler, hybrid_callbacks

SETTINGS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "default": {},
    "jumps": {"warmup_steps": 0, "full_steps": 2, "verify_window": 1, "verify_resolution": 0.0},
    "linear": {"predictor": "linear"},
}


def _single_cpu_default(kwargs: dict[str, Any]) -> bool:
    return (
        kwargs.get("strategy", "auto") == "auto"
        and kwargs.get("accelerator", "auto") in ("auto", "cpu")
        and kwargs.get("devices", "auto") in ("auto", 1, "1", [0])
        and kwargs.get("num_nodes", 1) == 1
    )


def pytest_configure(config: Any) -> None:
    settings = SETTINGS[os.environ.get("HYBRID_INJECT", "default")]
    if settings is None:
        return
    init = pl.Trainer.__init__

    alone = os.environ.get("HYBRID_ALONE") == "1"

    def injected(self: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if alone:
            callbacks = kwargs.get("callbacks") or []
            callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
            kwargs["callbacks"] = [*callbacks, HybridScheduler(**settings)]
        elif _single_cpu_default(kwargs):
            callbacks = kwargs.get("callbacks") or []
            callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
            kwargs.update(strategy=HybridPredictStrategy(), callbacks=[*callbacks, *hybrid_callbacks(**settings)])
        init(self, *args, **kwargs)

    pl.Trainer.__init__ = injected
