"""A pytest plugin that runs Lightning's own test suite with the plugin inside, as a user adds it: ``HybridScheduler``
appended to the callbacks of every ``Trainer``, whose own strategy stays.

    cd <lightning checkout>/tests && PYTHONPATH=<this checkout> HYBRID_INJECT=default \\
        python -m pytest -p tests.lightning_inject tests_pytorch/models/test_hooks.py

The 13 modules the record comes from (``benchmarks/results/lightning_tests/``), under ``tests_pytorch/``:
``models/test_hooks.py tuner/test_lr_finder.py checkpointing/test_model_checkpoint.py
trainer/optimization/test_optimizers.py trainer/optimization/test_manual_optimization.py callbacks/test_lr_monitor.py
callbacks/test_stochastic_weight_avg.py trainer/connectors/test_callback_connector.py loops/test_loops.py
callbacks/test_early_stopping.py callbacks/test_weight_averaging.py trainer/test_trainer.py
loops/test_training_loop.py``.

``HYBRID_INJECT`` picks what is added: ``default`` (``HybridScheduler()``), ``jumps`` (the default rule jumping every
2 steps, judged over 1, with no limit on the verdict's sight), ``inert`` (a stateful callback that does nothing: the
control, what any extra stateful callback costs Lightning's tests), ``linear`` (the per-step mode: its hybrid
strategy and ``HybridScheduler(predictor="linear")``, on the Trainers with Lightning's default strategy on one CPU
device) or ``off`` (nothing: the plain baseline). Not collected by this project's suite (no ``test_`` prefix)."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_hybrid import HybridPredictStrategy, HybridScheduler

SETTINGS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "inert": None,
    "default": {},
    "jumps": {"warmup_steps": 0, "full_steps": 2, "verify_window": 1, "verify_resolution": 0.0},
    "linear": {"predictor": "linear"},
}


class Inert(Callback):
    """A stateful callback that does nothing (at module level: spawned ranks unpickle it)."""

    def state_dict(self) -> dict[str, Any]:
        return {"inert": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _single_cpu_default(kwargs: dict[str, Any]) -> bool:
    return (
        kwargs.get("strategy", "auto") == "auto"
        and kwargs.get("accelerator", "auto") in ("auto", "cpu")
        and kwargs.get("devices", "auto") in ("auto", 1, "1", [0])
        and kwargs.get("num_nodes", 1) == 1
    )


def pytest_configure(config: Any) -> None:
    mode = os.environ.get("HYBRID_INJECT", "default")
    if mode == "off":
        return
    init = pl.Trainer.__init__

    def injected(self: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        callbacks = kwargs.get("callbacks") or []
        callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
        if mode == "inert":
            kwargs["callbacks"] = [*callbacks, Inert()]
        elif mode != "linear":
            kwargs["callbacks"] = [*callbacks, HybridScheduler(**SETTINGS[mode])]
        elif _single_cpu_default(kwargs):
            kwargs.update(strategy=HybridPredictStrategy(), callbacks=[*callbacks, HybridScheduler(**SETTINGS[mode])])
        init(self, *args, **kwargs)

    pl.Trainer.__init__ = injected
