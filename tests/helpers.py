"""Small models, data and a logger that keeps what it is given, shared by the tests."""

from __future__ import annotations

import socket
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_hybrid import HybridConfig, HybridPredictStrategy, HybridScheduler, Phase, hybrid_callbacks
from lightning_hybrid.algorithms import DivergenceCheck, ResidualCorrection
from lightning_hybrid.encoder import StateEncoder
from lightning_hybrid.engine import Components, HybridEngine, LocalCollectives
from lightning_hybrid.predictors import LinearPredictor, OuterMomentum, Plan


def regression_data(n: int = 256, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    return TensorDataset(x, torch.tanh(x @ w) + 0.05 * torch.randn(n, 1, generator=g))


def loader(n: int = 256, batch_size: int = 32, seed: int = 1) -> DataLoader:
    return DataLoader(regression_data(n, seed), batch_size=batch_size, shuffle=False)


class RegressionModel(L.LightningModule):
    """A small MLP that counts its forward passes and backward passes."""

    def __init__(
        self,
        lr: float = 1e-2,
        optimizer: str = "adam",
        automatic: bool = True,
        param_groups: bool = False,
        scheduler: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.lr, self.optimizer_name, self.param_groups, self.use_scheduler = lr, optimizer, param_groups, scheduler
        self.automatic_optimization = automatic
        self.training_step_calls = 0
        self.backward_calls = 0
        self.forward_with_grad = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.training_step_calls += 1
        self.forward_with_grad += int(torch.is_grad_enabled())
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.backward_calls += 1
        super().backward(loss, *args, **kwargs)

    def configure_optimizers(self) -> Any:
        params: Any = self.parameters()
        if self.param_groups:
            params = [
                {"params": self.net[0].parameters(), "lr": self.lr},
                {"params": self.net[2].parameters(), "lr": self.lr / 4},
            ]
        if self.optimizer_name == "fused_adam":  # takes `found_inf`: quiet steps are guarded on the device
            opt = torch.optim.Adam(params, lr=self.lr, fused=True)
        else:
            opt = (torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.SGD)(params, lr=self.lr)
        if not self.use_scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.99)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class SometimesExploding(LinearPredictor):
    """Blows up the plans made while its observation count is in an odd block of five: a pure function of its
    checkpointed state, so resumed runs see the same failures."""

    def plan(self, horizon: int, features=None) -> Plan:
        plan = super().plan(horizon, features)
        if (self._observed // 5) % 2:
            plan.scales = [[s * 1e4 for s in row] for row in plan.scales]
        return plan


class MemoryLogger(Logger):
    """Keeps every ``log_metrics`` call, so tests can read the per-step curves back."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def series(self, key: str) -> dict[int, float]:
        return {step: m[key] for step, m in self.rows if key in m}


class StepRecorder(L.Callback):
    """Records, per optimizer step, the model's backward and training_step calls since the previous step."""

    def __init__(self) -> None:
        self.backward: dict[int, int] = {}
        self.forward: dict[int, int] = {}
        self._last = (0, 0)
        self._step = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self._step:
            return
        self._step = trainer.global_step
        now = (pl_module.backward_calls, pl_module.training_step_calls)
        self.backward[self._step] = now[0] - self._last[0]
        self.forward[self._step] = now[1] - self._last[1]
        self._last = now


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """All parameters, flattened; FSDP shards are gathered first (a collective: every rank must call it)."""
    full = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    return torch.cat([p.detach().flatten().clone() for p in full])


def free_port() -> int:
    """A free TCP port on loopback, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scheduler_of(trainer: L.Trainer) -> HybridScheduler:
    return next(cb for cb in trainer.callbacks if isinstance(cb, HybridScheduler))


# Short phases that always predict: no bandit, the horizon follows the scheduler's halve-on-failure rule.
FAST_PHASES = dict(
    warmup_steps=5,
    full_steps=6,
    max_predict_steps=4,
    confidence_threshold=0.0,
    correction_steps=2,
    predict_lr_fraction=1.0,
)
FAST = {**FAST_PHASES, "bandit": False, "predictor": "linear"}  # per-step prediction, whose phases these exercise
# The rule on short cycles: a jump every 6 steps after 5 of warmup, judged over the next cycle's last 3, on batches
# whose losses spread too widely for the default's limit (verify_resolution) to let the verdict judge: off.
RULE_PHASES = dict(warmup_steps=5, full_steps=6)
RULE_VERDICT = dict(verify_window=3, verify_resolution=0.0)
RULE = {**RULE_PHASES, **RULE_VERDICT}  # hybrid_callbacks(predictor="outer", **RULE)
UNGUARDED = dict(keep_norms=False, restart=False)  # `outer` as SNOO publishes it, whose mechanism these tests pin


def snoo(*args: Any, **kwargs: Any) -> OuterMomentum:
    """``outer`` without the default's guards, with ``RULE_VERDICT`` (each may be set again by keyword)."""
    return OuterMomentum(*args, **{**UNGUARDED, **RULE_VERDICT, **kwargs})


def hybrid_trainer(
    max_steps: int = 60,
    settings: dict[str, Any] | None = None,
    extra_callbacks: list[L.Callback] | None = None,
    hybrid: list[L.Callback] | None = None,
    **trainer_kwargs: Any,
) -> tuple[L.Trainer, MemoryLogger]:
    """A CPU Trainer with the hybrid strategy and callbacks.

    ``hybrid`` replaces the default ``hybrid_callbacks(**FAST, **settings)``; ``extra_callbacks`` are appended.
    Trainer arguments (``strategy``, ``logger``, ...) override the defaults.
    """
    logger = MemoryLogger()
    trainer_kwargs.setdefault("enable_checkpointing", False)
    trainer_kwargs.setdefault("log_every_n_steps", 1)  # the tests read per-step curves
    trainer_kwargs.setdefault("logger", logger)
    trainer_kwargs.setdefault("strategy", HybridPredictStrategy())
    trainer_kwargs.setdefault("accelerator", "cpu")
    hybrid = hybrid if hybrid is not None else hybrid_callbacks(**{**FAST, **(settings or {})})
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=[*hybrid, *(extra_callbacks or [])],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **trainer_kwargs,
    )
    return trainer, logger


def phases(logger: MemoryLogger) -> dict[int, Phase]:
    return {step: Phase(int(v)) for step, v in logger.series("hybrid/phase").items()}


def bare_engine(config: HybridConfig, predictor: Any, optimizer: torch.optim.Optimizer, monitor: Any = None):
    """An engine bound to ``optimizer`` without a Trainer, with the optimizer hooks the scheduler registers."""
    engine = HybridEngine(config)
    engine.connect(Components(predictor, StateEncoder(), ResidualCorrection(), monitor or DivergenceCheck()))
    engine.bind(optimizer, LocalCollectives())
    optimizer.register_step_pre_hook(lambda *_: engine.before_optimizer_step())
    optimizer.register_step_post_hook(lambda *_: engine.after_optimizer_step())
    return engine


def bare_step(engine: HybridEngine, optimizer: torch.optim.Optimizer, loss_fn: Any, step: int) -> torch.Tensor:
    """One step of a plain torch loop, routed through the engine as a hybrid strategy routes Lightning's: the
    closure's backward through ``engine.backward``, the update through ``engine.optimizer_step``. Returns the
    closure's loss (computed without a backward pass on a predicted step)."""
    engine.begin_step()
    losses = []

    def closure() -> torch.Tensor:
        loss = loss_fn()
        losses.append(loss.detach())
        engine.backward(loss, loss.backward)
        return loss

    optimizer.zero_grad()
    engine.optimizer_step(optimizer, closure, optimizer.step)
    engine.end_step(step)
    return losses[0]
