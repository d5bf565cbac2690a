"""The fault suite's harness: a model that injects faults in chosen phases, and the checks every case shares."""

from __future__ import annotations

import math
import os
from typing import Any

import lightning as L
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_hybrid import Phase, hybrid_callbacks
from tests.faults.table import row, rows_on_page
from tests.helpers import (
    DEFAULT_JUMPING,
    FAST,
    RULE_PHASES,
    RegressionModel,
    flat_params,
    hybrid_trainer,
    loader,
    scheduler_of,
)

STEPS = 500
# the suite's two modes: the default rule (`outer` with its guards), jumping on short cycles, and the per-step mode
MODES = {"default": {"predictor": "outer", **RULE_PHASES, **DEFAULT_JUMPING}, "per-step": FAST}


class FaultyModel(RegressionModel):
    """Injects ``faults[(phase, n)]`` into the ``n``-th ``training_step`` (1-based) that runs in ``phase``:
    ``nan``/``inf`` losses, a ``spike`` (loss x10), an ``explosion`` (loss, hence gradients, x1e6) or a
    ``corrupt`` batch (the inputs cast to the wrong dtype, so the model's own layer raises)."""

    def __init__(self, faults: dict[tuple[Phase, int], str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults = dict(faults or {})
        self.calls: dict[Phase, int] = {}
        self.injected: list[tuple[int, Phase, str]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        phase = scheduler_of(self.trainer).phase
        self.calls[phase] = self.calls.get(phase, 0) + 1
        kind = self.faults.get((phase, self.calls[phase]))
        if kind is not None:
            self.injected.append((self.trainer.global_step, phase, kind))
        if kind == "corrupt":
            x, y = batch
            batch = (x.long(), y)
        loss = super().training_step(batch, batch_idx)
        factor = {"nan": math.nan, "inf": math.inf, "spike": 10.0, "explosion": 1e6}.get(kind, 1.0)
        return loss * factor


class FiniteWatch(L.Callback):
    """Checks after every step that no NaN/Inf reached the parameters; keeps the last finished step's weights."""

    def __init__(self) -> None:
        self.steps = 0
        self.all_finite = True
        self.last = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.steps += 1
        self.last = flat_params(pl_module)
        self.all_finite &= bool(torch.isfinite(self.last).all())


def train(
    faults: dict | None = None,
    settings: dict | None = None,
    hybrid: list | None = None,
    steps: int = STEPS,
    mode: str = "per-step",
    model: FaultyModel | None = None,
) -> tuple[FaultyModel, L.Trainer, FiniteWatch, float]:
    """One run of ``mode`` (``MODES``; ``settings`` on top, or the callbacks ``hybrid``); returns the model, trainer,
    watch and final validation loss."""
    watch = FiniteWatch()
    hybrid = hybrid if hybrid is not None else hybrid_callbacks(**{**MODES[mode], **(settings or {})})
    trainer, _ = hybrid_trainer(steps, hybrid=hybrid, extra_callbacks=[watch], logger=False)
    model = model or FaultyModel(faults, scheduler=True)  # a decaying LR: runs converge, so a transient fault heals
    trainer.fit(model, loader())
    val = trainer.validate(model, loader(128, seed=2), verbose=False)[0]["val_loss"]
    return model, trainer, watch, float(val)


def record(record_property, fault: str, where: str, outcome: str, mode: str = "per-step") -> None:
    """What a case tried and what happened, for the reliability table (``tests/faults/table.py``), and that the
    page's table says so (but where ``FAULT_TABLE=rewrite`` records the rows to write it)."""
    record_property("fault", fault)
    record_property("where", where)
    record_property("outcome", outcome)
    record_property("mode", mode)
    if os.environ.get("FAULT_TABLE") != "rewrite":
        said = row(mode, fault, where, "passed", outcome)
        assert said in rows_on_page(), (
            f"docs/reliability.md's table lacks this case's row, {said}: write it with `FAULT_TABLE=rewrite pytest "
            "tests/faults --junitxml=faults.xml && python -m tests.faults.table faults.xml`"
        )


class Injected(RuntimeError):
    """The fault this suite raises."""


class FailAt(TorchDispatchMode):
    """Raises instead of running the ``at``-th operation dispatched (never, for ``at=-1``), and records each one's
    name and whether it writes one of ``run``'s tensors (the weights, the anchor and the rule's state)."""

    def __init__(self, at: int, run: list[torch.Tensor]) -> None:
        super().__init__()
        self.at, self.seen = at, []
        self.run = {t.untyped_storage().data_ptr() for t in run}

    def step(self, name: str, writes: bool = False) -> None:
        """One operation, dispatched or not (the collective, a read of a CPU tensor, dispatch nothing)."""
        self.seen.append((name, writes))
        if len(self.seen) - 1 == self.at:
            raise Injected(f"injected into {name}")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__
        targets = args[0] if args and isinstance(args[0], (list, tuple)) else args[:1]
        in_place = name.split(".")[0].endswith("_")
        writes = in_place and any(
            isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.run for t in targets
        )
        self.step(name, writes)
        return func(*args, **(kwargs or {}))
