"""What the tests share: small models and data, a logger that keeps what it is given, Trainers and settings, a
bare engine, the resume runs' callbacks, the training app's short runs and the launcher of DDP ranks.

No test imports another test module (``tests/test_import_layers.py`` checks it): what two of them use lives here.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import pytorch_lightning
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_hybrid import (
    DivergenceMonitor,
    DynamicsPredictor,
    HybridConfig,
    HybridPredictStrategy,
    HybridScheduler,
    Phase,
    ResidualCorrector,
    hybrid_callbacks,
)
from lightning_hybrid.algorithms import DivergenceCheck, ResidualCorrection
from lightning_hybrid.encoder import StateEncoder
from lightning_hybrid.engine import Components, HybridEngine, TorchCollectives
from lightning_hybrid.predictors import LinearPredictor, OuterMomentum, Plan
from lightning_hybrid.summary import format_summary

ROOT = Path(__file__).resolve().parents[1]  # the checkout

# -------------------------------------------------------------------------------------------------- data and models


def regression_data(n: int = 256, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    return TensorDataset(x, torch.tanh(x @ w) + 0.05 * torch.randn(n, 1, generator=g))


def loader(n: int = 256, batch_size: int = 32, seed: int = 1) -> DataLoader:
    return DataLoader(regression_data(n, seed), batch_size=batch_size, shuffle=False)


class _Regression:
    """A small MLP that counts its forward passes and backward passes: the body of :class:`RegressionModel`, a
    ``LightningModule`` of either Lightning package."""

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


class RegressionModel(_Regression, L.LightningModule):
    """A small MLP that counts its forward passes and backward passes."""


class StandaloneRegression(_Regression, pytorch_lightning.LightningModule):
    """:class:`RegressionModel` written on the standalone ``pytorch_lightning`` package."""


class NanAt(RegressionModel):
    """Returns a NaN loss at the given global steps."""

    def __init__(self, steps: set[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nan_steps = set(steps)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.trainer.global_step in self.nan_steps else loss


class MuonModel(RegressionModel):
    """Manual optimization with two optimizers on one loss, as modern recipes train: Muon for the hidden matrix,
    AdamW for the biases and the head; one ``manual_backward``, then each ``step`` (clipped, each with its own
    scheduler). ``losses``: how many losses and backward passes a batch takes (2: a generator and a discriminator,
    each optimizer on its own); ``every``: the AdamW steps once in this many batches; ``nan_at``: batches whose loss
    is NaN (counted from 0)."""

    def __init__(self, lr: float = 2e-2, losses: int = 1, every: int = 1, nan_at: tuple[int, ...] = (), **kw: Any):
        super().__init__(lr=lr, automatic=False, **kw)
        self.losses, self.every, self.nan_at, self.batches = losses, every, nan_at, 0

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        muon, adamw = self.optimizers()
        loss = nn.functional.mse_loss(self(x), y)
        if self.batches in self.nan_at:
            loss = loss * float("nan")
        steps = [muon, adamw] if self.batches % self.every == 0 else [muon]
        if self.losses == 1:
            self.manual_backward(loss)
            for opt in steps:
                self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
                opt.step()
                opt.zero_grad()
        else:  # each optimizer on a loss of its own, stepped after its own backward pass
            for opt in steps:
                self.manual_backward(nn.functional.mse_loss(self(x), y))
                opt.step()
                opt.zero_grad()
        for scheduler in self.lr_schedulers():
            scheduler.step()
        self.batches += 1
        return loss

    def configure_optimizers(self) -> Any:
        hidden = [self.net[0].weight]
        rest = [self.net[0].bias, *self.net[2].parameters()]
        muon = torch.optim.Muon(hidden, lr=self.lr, adjust_lr_fn="match_rms_adamw")
        adamw = torch.optim.AdamW(rest, lr=self.lr / 4)
        schedulers = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.99) for opt in (muon, adamw)]
        return [muon, adamw], schedulers


class SometimesExploding(LinearPredictor):
    """Blows up the plans made while its observation count is in an odd block of five: a pure function of its
    checkpointed state, so resumed runs see the same failures."""

    def plan(self, horizon: int, features=None) -> Plan:
        plan = super().plan(horizon, features)
        if (self._observed // 5) % 2:
            plan.scales = [[s * 1e4 for s in row] for row in plan.scales]
        return plan


# -------------------------------------------------------------------------------------------- loggers and recorders


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


# --------------------------------------------------------------------------------------------- parameters and ports


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """All parameters, flattened; FSDP shards are gathered first (a collective: every rank must call it)."""
    full = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    return torch.cat([p.detach().flatten().clone() for p in full])


def free_port() -> int:
    """A free TCP port on loopback, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -------------------------------------------------------------------------------------------- Trainers and settings


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
# the defaults on short cycles, jumping far enough that the verdict undoes some jumps and keeps others
DEFAULT_JUMPING = dict(verify_window=3, verify_resolution=0.0, outer_lr=1.6)


# the rules that run as one callback beside the user's strategy, on short cycles (the default jumping)
BESIDE = {"default": {**RULE_PHASES, **DEFAULT_JUMPING}, "gpa": {"predictor": "gpa", **RULE_PHASES}}
UNTIMED = ("wall_time_s", "time_by_phase_s", "fit")  # a summary's entries of the clock, not of the training


def trained(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary's entries of the training: what two runs that trained alike share."""
    return {k: v for k, v in summary.items() if k not in UNTIMED}


def users_trainer(callbacks: list, steps: int = 60, package: Any = L, **kwargs: Any) -> L.Trainer:
    """A Trainer as a user writes one, of ``package`` (``lightning`` or ``pytorch_lightning``): Lightning's own
    strategy (``auto``: one CPU device), the plugin a callback; quiet unless ``kwargs`` say otherwise."""
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return package.Trainer(accelerator="cpu", devices=1, max_steps=steps, callbacks=callbacks, **(quiet | kwargs))


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
    """Each logged step's phase, by the optimizer step it ended (1 for the first): Lightning logs a batch's values
    at the count of batches that stepped before it, one less."""
    return {step + 1: Phase(int(v)) for step, v in logger.series("hybrid/phase").items()}


def after_step(logger: MemoryLogger, tag: str) -> dict[int, float]:
    """A ``hybrid/*`` series by the optimizer step each value ended (see :func:`phases`)."""
    return {step + 1: v for step, v in logger.series(tag).items()}


# ------------------------------------------------------------------------------------------------ a bare torch loop


def bare_engine(config: HybridConfig, predictor: Any, optimizer: torch.optim.Optimizer, monitor: Any = None):
    """An engine bound to ``optimizer`` without a Trainer, with the optimizer hooks the scheduler registers."""
    engine = HybridEngine(config)
    engine.connect(Components(predictor, StateEncoder(), ResidualCorrection(), monitor or DivergenceCheck()))
    engine.bind(optimizer, TorchCollectives())
    optimizer.register_step_pre_hook(lambda *_: engine.before_optimizer_step())
    optimizer.register_step_post_hook(lambda opt, *_: engine.after_optimizer_step(opt))
    return engine


def report_of(engine: HybridEngine) -> str:
    """A bare engine's end-of-fit text, as the scheduler prints it."""
    summary = engine.summary()
    return format_summary(summary, engine.family.report(summary))


def bare_step(engine: HybridEngine, optimizer: torch.optim.Optimizer, loss_fn: Any, step: int) -> torch.Tensor:
    """One step of a plain torch loop, routed through the engine as a hybrid strategy routes Lightning's: the
    closure's backward through ``engine.route.backward``, the update through ``engine.route.optimizer_step``.
    Returns the closure's loss (computed without a backward pass on a predicted step)."""
    engine.begin_step()
    losses = []

    def closure() -> torch.Tensor:
        loss = loss_fn()
        losses.append(loss.detach())
        engine.route.backward(loss, loss.backward)
        return loss

    optimizer.zero_grad()
    engine.route.optimizer_step(optimizer, closure, optimizer.step)
    engine.end_step(step)
    return losses[0]


# ------------------------------------------------------------------------------------------------------ resume runs

# short phases, so 40 steps pass through every phase several times (tests/test_resume.py, the golden runs, DDP)
RESUME_SETTINGS = {**FAST_PHASES, "warmup_steps": 3, "full_steps": 3, "max_predict_steps": 5}
LEARNED = {  # the learned predictors' settings for short runs: trained early and often
    "mlp": dict(train_every=2, batch_size=4, min_observations=3),
    "rssm": dict(train_every=2, batch_size=4, window=4, min_observations=3),
}


def resume_callbacks(kind: str, memory: str = "none", capture: str = "per_step") -> list[L.Callback]:
    """The hybrid callbacks of the resume runs: ``linear`` (no bandit), ``exploding`` (``SometimesExploding``, so
    it rolls back; ``memory`` and ``capture`` set the scheduler's) or a learned predictor (``mlp``, ``rssm``)."""
    if kind == "linear":
        return hybrid_callbacks(predictor="linear", **RESUME_SETTINGS, bandit=False)
    if kind == "exploding":
        predictor = DynamicsPredictor(SometimesExploding())
        scheduler = HybridScheduler(**RESUME_SETTINGS, predict_memory=memory, capture_buffer=capture)
        return [scheduler, predictor, ResidualCorrector(), DivergenceMonitor()]
    # learned predictors with the bandit, whose step-count costs make its decisions deterministic
    return hybrid_callbacks(predictor=kind, cost="steps", alpha=2.0, **RESUME_SETTINGS, **LEARNED[kind])


# ------------------------------------------------------------------------------------------------- the training app

APP_STEPS = 12
# short, fast runs that predict per step (the linear predictor): short phases, confidence threshold 0, no bandit
APP_TRAINER = [
    "predictor=linear",
    f"trainer.max_steps={APP_STEPS}",
    "trainer.val_check_interval=6",
    "trainer.limit_val_batches=2",
    "trainer.accelerator=cpu",
    "trainer.enable_model_summary=false",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",  # per-step curves, read back by the tests
    "callbacks=none",
    "hybrid.warmup_steps=3",
    "hybrid.correction_steps=2",
    "hybrid.bandit=false",
    "predictor.min_observations=2",
]
APP_PHASES = [
    "hybrid.full_steps=3",
    "hybrid.max_predict_steps=3",
    "hybrid.confidence_threshold=0.0",
    "hybrid.predict_lr_fraction=1.0",
]
APP_SMALL_GPT = ["data.max_bytes=20000", "model.n_layer=1", "model.n_embd=32"]
APP_TINY = APP_TRAINER + APP_PHASES + APP_SMALL_GPT


def app_config(tmp_path: Path, *overrides: str, base: list[str] = APP_TINY) -> Any:
    """The app's composed ``train`` config: ``base``, then the output folder ``tmp_path``, then ``overrides``."""
    # imported when called: importing the app registers its configs with Hydra, which the DDP ranks need not do
    from hydra import compose, initialize_config_module

    from lightning_hybrid.train import CONFIG_MODULE

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose("train", overrides=[*base, f"paths.output_dir={tmp_path}", *overrides])


def console(*argv: str) -> int | str | None:
    """``lightning-hybrid-train *argv`` in this process, as the console script runs it: its exit status, or the line
    it exits with (``sys.exit(message)`` prints that one line to stderr). A process of its own costs seconds of
    imports; the wheel test runs the real console script. Hydra's and the app's logging set-up is undone after."""
    from lightning_hybrid import train

    loggers = [logging.getLogger(name) for name in ("", "lightning", "lightning.pytorch")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    argv_before = sys.argv
    sys.argv = ["lightning-hybrid-train", *argv]
    try:
        train.main()
    except SystemExit as exit_:
        return exit_.code
    finally:
        sys.argv = argv_before
        for lg, handlers, level, propagate in saved:
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate
    return 0


# -------------------------------------------------------------------------------------------------------- DDP ranks


LAUNCHED = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK", "GLOBAL_RANK")


def script_env(**extra: str) -> dict[str, str]:
    """The environment of a suite script run in a process of its own: this one's, one torch thread, the checkout
    importable, ``extra`` on top. Lightning's ``seed_everything`` in this process (the app, the harness) leaves
    ``PL_GLOBAL_SEED`` and ``PL_SEED_WORKERS`` behind, and its subprocess launcher a rank's ``LOCAL_RANK``,
    ``WORLD_SIZE`` and master address (with which a script's own launcher would take itself for a launched rank and
    wait for the others); the script inherits none of them, or its runs depend on test order."""
    here = {k: v for k, v in os.environ.items() if not k.startswith("PL_") and k not in LAUNCHED}
    return here | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)} | extra


def run_script(module: str, *args: str | Path) -> None:
    """``python -m module *args`` in a process of its own, from the checkout; fails with its output's end unless it
    succeeds."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    done = subprocess.run(cmd, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def run_scenarios(out_dir: Path, scenarios: dict[str, tuple[str, ...]]) -> dict[str, list[dict]]:
    """Run every scenario (name: ``(kind, strategy, resume)``, then the batches of a user module's run and the
    nodes, 1 or 2: one process each, as a cluster launcher starts them) one after another in one process group of
    two ranks (``tests/ddp_worker.py``); returns what each rank wrote, by scenario. The first scenario's placement is
    the process group's rendezvous (through environment variables)."""
    defaults = ("", 1)  # batches, nodes
    run_script(
        "tests.ddp_worker",
        out_dir,
        *("|".join(map(str, (n, *s, *defaults[len(s) - 3 :]))) for n, s in scenarios.items()),
    )
    load = partial(torch.load, weights_only=False)
    return {name: [load(out_dir / name / f"rank{r}.pt") for r in range(2)] for name in scenarios}


FSDP_UNITS = ("fsdp-per-layer", "plain-fsdp-per-layer", "fsdp", "plain-fsdp")  # hybrid and plain, per layer and whole

# The two-process scenarios the DDP and FSDP tests read, run in one launch: name -> (kind, strategy, resume[,
# batches]) (see tests/ddp_worker.py); "save" checkpoints every 16 steps (epoch ends), "save-midepoch" every 12, and
# a `resumed-` run goes on from the `save-` run's second checkpoint.
SAVE_EVERY = {"save": 16, "save-midepoch": 12}  # steps between checkpoints: at epoch ends, or inside epochs
USER_STEPS = 40  # the fits of modules as users write them (GPT-2 under FSDP costs most); the others train 60
DISTRIBUTED = {
    "rssm": ("rssm", "ddp", ""),
    "exploding-fsdp-per-layer": ("exploding", "fsdp-per-layer", ""),
    "outer": ("outer", "ddp", ""),
    "outer_aligned": ("outer_aligned", "ddp", ""),
    "outer_norm": ("outer_norm", "ddp", ""),
    "outer_restart-fused_adam": ("outer_restart-fused_adam", "ddp", ""),
    "outer_aligned-fsdp": ("outer_aligned", "fsdp", ""),
    "default": ("default", "ddp", ""),
    "muon": ("muon", "ddp", ""),
    "save-default-fsdp": ("default", "fsdp", "save"),
    "save-linear-ddp": ("linear", "ddp", "save"),
    "save-exploding-ddp": ("exploding", "ddp", "save"),
    "save-linear-fsdp": ("linear", "fsdp", "save"),
    "gpa": ("gpa", "ddp", ""),  # primal averaging under DDP and FSDP, and resumed from a sharded checkpoint
    "save-gpa-fsdp": ("gpa", "fsdp", "save"),
    # modules as users write them (tests/user_modules.py), plain and hybrid, under DDP and FSDP per layer; GPT-2
    # then validated, tested, predicted and fitted again by the same Trainer, under FSDP per layer and whole
    "lstm-plain-fsdp-per-layer": ("lstm", "plain-fsdp-per-layer", ""),
    **{f"gpt2-{s}": ("gpt2", s, "after") for s in FSDP_UNITS},
    "gpt2-ddp": ("gpt2", "ddp", ""),  # the defaults under FSDP against DDP, on a module that calls a submodule
    **{f"save-{m}-fsdp-per-layer": (m, "fsdp-per-layer", "save") for m in ("gpt2", "lstm")},
    "gpt2_manual-fsdp-per-layer": ("gpt2_manual", "fsdp-per-layer", ""),
    # checkpoints inside epochs, resumed: plain FSDP with torchdata's stateful loader and its distributed sampler;
    # the plugin's strategies with the loaders as users write them (TokenData): a shuffled StatefulDataLoader and the
    # demos' ResumableLoader
    "save-gpt2-plain-fsdp-midepoch": ("gpt2", "plain-fsdp", "save-midepoch", "stateful"),
    # the demos' loader resumes alike under any strategy (its own test shows each rank's shard resuming)
    **{f"save-gpt2-{s}-shuffled": ("gpt2", s, "save-midepoch", "shuffled") for s in ("ddp", "fsdp")},
    "save-gpt2-ddp-resumable": ("gpt2", "ddp", "save-midepoch", "resumable"),
    # the plugin as one callback beside strategies a user chose, Lightning's DDP and FSDP2 (ModelParallelStrategy),
    # the default rule resumed from its second checkpoint; gpa beside Lightning's DDP
    **{f"save-alone-{s}": ("alone", s, "save") for s in ("user-ddp", "user-fsdp2")},
    "alone_gpa-user-ddp": ("alone_gpa", "user-ddp", ""),
}


# Scenarios that are a saving scenario's run: checkpoints change nothing a test reads (the weights, the phases and
# every counter are the same), so one run serves both names (tests/conftest.py).
SAME_RUN = {
    "linear": "save-linear-ddp",
    "exploding": "save-exploding-ddp",
    "linear-fsdp": "save-linear-fsdp",
    "default-fsdp": "save-default-fsdp",
    "gpa-fsdp": "save-gpa-fsdp",
    "lstm-fsdp-per-layer": "save-lstm-fsdp-per-layer",
}


def written(paths: Iterable[Path]) -> dict[Path, tuple[int, int]]:
    """Each file's inode and modification time: a rewrite through ``write_atomic`` (a rename) gets a new inode,
    however soon after the first write it comes, where a time alone may not tick on a fast machine."""
    return {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in paths}


def step_of(checkpoint: Path) -> int:
    """The step of a checkpoint saved as ``step=N.ckpt`` (``ModelCheckpoint(filename="{step}")``)."""
    return int(checkpoint.stem.split("=")[1])


def by_step(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, every one saved as ``step=N.ckpt`` (another name fails), by step."""
    return sorted(folder.glob("*.ckpt"), key=step_of)


def saved_checkpoints(out_dir: Path) -> list[Path]:
    """A `save` scenario's checkpoints, by step."""
    return by_step(out_dir / "ckpt")


def per_rank_entries(folder: Path) -> list[str]:
    """The plugin's per-rank entries in a distributed checkpoint (``lightning_hybrid.callbacks.sharded_state``)."""
    from torch.distributed.checkpoint import FileSystemReader

    entries = FileSystemReader(folder).read_metadata().state_dict_metadata
    return sorted(key for key in entries if "lightning_hybrid" in key)


def plugin_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The ``HybridScheduler``'s state in a checkpoint's contents (Lightning keys each callback's by its class)."""
    return next(v for k, v in checkpoint["callbacks"].items() if "HybridScheduler" in k)


@contextmanager
def cpu_bound(processes: int = 2, share_a_core: bool = False) -> Iterator[None]:
    """``processes`` busy loops beside the test, as other jobs on a shared machine. With ``share_a_core``, the
    loops and every thread of this process run on one core (Linux's affinity), so the load takes this process's
    CPU time whatever the machine's core count: on a machine of many cores, free loops take none of it."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    threads = [int(t) for t in os.listdir("/proc/self/task")] if share_a_core else []
    before = {t: os.sched_getaffinity(t) for t in threads}
    try:
        if share_a_core:
            core = {min(os.sched_getaffinity(0))}
            for pid in [*threads, *(hog.pid for hog in hogs)]:
                os.sched_setaffinity(pid, core)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        for thread, cores in before.items():
            with suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread, cores)
