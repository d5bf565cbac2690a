"""HybridScheduler: the callback that runs the :class:`~lightning_hybrid.engine.HybridEngine` inside ``fit``: it
finds the components, hands the engine to the hybrid strategy (which routes each step through it), calls it from
Lightning's batch hooks, logs its scalars and checkpoints its state, so a resumed run continues exactly."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.optim import Optimizer
from typing_extensions import Unpack, override

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.checkpoint_flag import UNVERIFIED, say_resuming, say_unverified
from lightning_hybrid.callbacks.messages import info, warn
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.resumable import say_unresumable
from lightning_hybrid.callbacks.routing import DEFAULT_RULE, SchedulerSettings, split_scheduler_settings
from lightning_hybrid.callbacks.scalars import log_step, log_unverified, logging_step
from lightning_hybrid.callbacks.wiring import (
    find_component,
    last_step,
    predictor_host,
    refuse_sparse_gradients,
    refuse_untrainable,
    used_corrector,
    warn_ignored,
    warn_short_fit,
)
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import Components, HybridEngine, OptimizerSet, family_of
from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import RunCounters, format_summary
from lightning_hybrid.tensorboard import write_layout

SUMMARY_FILENAME = "hybrid_summary.json"


class HybridScheduler(HybridComponent):
    """Runs hybrid training: the default rule's cycles and jumps (``outer``), or the per-step mode's Warmup → Full →
    Predict → Correct cycle; owns the run's record and summary.

    On its own it runs the default rule, with the other components it needs built with their defaults: a config
    file (LightningCLI) lists the strategy and this callback. The per-step mode adds a :class:`DynamicsPredictor`
    that names a per-step predictor (and its :class:`ResidualCorrector` and :class:`HorizonBandit`).

    Args:
        config: the phase settings, as a :class:`HybridConfig`; or give them as keywords.
        summary_filename: name of the JSON summary written at the end of a ``fit`` that trained.
        summary_dir: the folder it goes to; by default where the Trainer's first logger keeps its logs
            (``trainer.log_dir``), and nowhere without a logger (the summary is still printed).
        **settings: the phase settings (:class:`HybridConfig`'s) and the default rule's (``outer_lr``,
            ``outer_momentum``, ``keep_norms``, ``restart``, ``verify_window``, ``verify_sigmas``,
            ``verify_resolution``, ``alignment_window``, ``state_on_host``: see
            :class:`~lightning_hybrid.predictors.OuterMomentum`). Every one is listed in ``docs/settings.md``.
    """

    def __init__(
        self,
        config: HybridConfig | None = None,
        summary_filename: str = SUMMARY_FILENAME,
        summary_dir: str | None = None,
        **settings: Unpack[SchedulerSettings],
    ) -> None:
        phase, rule = split_scheduler_settings(settings)
        if config is not None and phase:
            raise ValueError(f"HybridScheduler: pass either `config` or phase settings, not both (got {sorted(phase)})")
        self.config = config if config is not None else HybridConfig(**phase)
        self.rule_settings = rule
        # the default rule's host, built here so that bad settings fail now; placed among the callbacks at setup
        self._own_host = DynamicsPredictor(DEFAULT_RULE, predictor_kwargs=rule)
        self.told_ignored: set[str] = set()  # settings hybrid_callbacks already warned the mode ignores
        self.summary_filename, self.summary_dir = summary_filename, summary_dir
        self.engine = HybridEngine(self.config, info=info, warn=warn)  # said beside the progress bar
        self.predictor: DynamicsPredictor | None = None
        self.monitor: DivergenceMonitor | None = None
        self.bandit: HorizonBandit | None = None
        self._strategy: Any = None
        self._hooks: list[Any] = []
        self._in_step = False
        self._per_batch, self._seen = 1, 0  # optimizers stepping each batch; the global step last seen
        # this fit has said that a checkpoint holds unverified weights; that one will not resume exactly
        self._said_unverified = self._said_unresumable = False

    @property
    def phase(self) -> Phase:
        return self.engine.phase

    @property
    def predicting(self) -> bool:
        return self.engine.predicting

    @property
    def counters(self) -> RunCounters:
        return self.engine.record.counters

    def progress(self) -> dict[str, str]:
        """What the progress bar shows: the phase, and the mode's running counts (jumps kept of those made, or the
        share of backward passes skipped)."""
        family = self.engine.family
        return {"phase": self.phase.label, **(family.progress() if family is not None else {})}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        self._said_unverified = self._said_unresumable = False
        self.predictor = predictor_host(trainer, self, self._own_host, self.rule_settings)
        try:
            family = family_of(self.predictor.predictor)
        except ValueError as err:  # an unregistered family, refused by name before training
            raise MisconfigurationException(str(err)) from err
        corrector = used_corrector(trainer, self, family, self.predictor.name)
        self.monitor = find_component(trainer, self, DivergenceMonitor, DivergenceMonitor)
        self.bandit = find_component(trainer, self, HorizonBandit, None)  # only where listed
        refuse_untrainable(pl_module)
        bandit = self.bandit.horizons if self.bandit is not None else None
        host, monitor = self.predictor, self.monitor.divergence
        parts = Components(host.predictor, host.encoder, corrector, monitor, bandit)
        try:  # what the family cannot run with, refused by name before training
            family.check(self.config, parts, trainer.strategy.sharded)
        except ValueError as err:
            raise MisconfigurationException(str(err)) from err
        warn_ignored(family, self.predictor.name, self.config, self.monitor.divergence, self.told_ignored)
        self.engine.connect(parts)
        self._strategy = trainer.strategy
        trainer.strategy.attach_step_handler(self.engine)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not any(optimizer.param_groups for optimizer in trainer.optimizers):  # Lightning's stand-in has none
            # plain Lightning trains without an optimizer, with a warning; so does this run
            warn("hybrid: `configure_optimizers` returned no optimizer: the plugin steps aside (plain Lightning).")
            return
        optimizers, family = list(trainer.optimizers), type(self.engine.family)
        if len(optimizers) > 1 and family.predicts_steps:
            raise MisconfigurationException(
                f"predictor={self.predictor.name!r} runs the per-step mode, which trains one optimizer (several param "
                f"groups are fine); `configure_optimizers` returned {len(optimizers)}. Several optimizers that step on "
                "one loss train under the default rule, predictor='outer'."
            )
        refuse_sparse_gradients(pl_module)
        # several optimizers on one loss are one trajectory; manual optimization counts a step per optimizer step
        self._per_batch, self._seen = len(optimizers), trainer.global_step
        optimizer = optimizers[0] if len(optimizers) == 1 else OptimizerSet(optimizers)
        start, end = trainer.global_step // self._per_batch, last_step(trainer)
        end = None if end is None else end // self._per_batch
        warn_short_fit(family, self.config, self.predictor.predictor, start, end, self.engine.record.afresh(start))
        self.engine.bind(
            optimizer,
            trainer.strategy,
            automatic=pl_module.automatic_optimization,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            global_step=start,
            world_size=trainer.world_size,
            buffers=list(pl_module.buffers()),
            last_step=end,
            logs=bool(trainer.loggers),
        )
        pre, post = self._before_optimizer_step, self._after_optimizer_step
        self._hooks = [h for o in optimizers for h in (o.register_step_pre_hook(pre), o.register_step_post_hook(post))]
        write_layout(trainer, self.engine.family.mode)
        self._in_step = False

    def _before_optimizer_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        self.engine.before_optimizer_step()

    def _after_optimizer_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        self.engine.after_optimizer_step(optimizer)

    def _step_aside(self, reason: str) -> None:
        """The run is not one the plugin can serve (said by the first batch that shows it): undo anything
        unverified and let Lightning train the rest of the fit plainly, saying why."""
        warn(f"hybrid: {reason}; the plugin steps aside and the rest of this fit is plain Lightning.")
        self.engine.step_aside(reason)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        if not self.engine.bound:
            return  # a fit the plugin stands aside from
        if not self._in_step:  # not another micro-batch of an accumulated step
            self._in_step = True
            self.engine.begin_step()
        if self.engine.step.phase is Phase.PREDICT:  # counted now: a progress bar ending its batch first sees it
            self.engine.record.counters.backward_skipped += 1

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        engine, global_step = self.engine, trainer.global_step
        if not engine.bound:
            return
        stepped, per_batch = global_step - self._seen, self._per_batch
        if stepped == 0:
            return  # accumulating: the optimizer has not stepped yet
        if per_batch > 1 and (stepped != per_batch or engine.step.backwards != 1):
            self._step_aside(
                f"{per_batch} optimizers took {stepped} steps on {engine.step.backwards} backward passes in one "
                "batch: several optimizers are one trajectory only where each steps once on one loss, not where "
                "they train on different losses (a generator and a discriminator, say)"
            )
            return
        self._seen = global_step
        predicted_loss = engine.end_step(global_step // per_batch)
        self._in_step = False
        if trainer.loggers and logging_step(trainer):
            log_step(pl_module, engine.metrics(predicted_loss))

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Validation inside a segment, or between a jump and its verdict, sees unverified weights: every
        validation of a fit logs ``hybrid/unverified`` (1 there, 0 elsewhere), so a reader of the curves knows
        which points may yet be rolled back."""
        if trainer.state.fn == "fit" and self.engine.bound:
            log_unverified(pl_module, self.engine.unverified)

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        """Say, once a fit, that a checkpoint holds unverified weights, or cannot resume inside its epoch exactly."""
        said, step = self._said_unverified, trainer.global_step
        self._said_unverified = say_unverified(self.engine.unverified, step, said)
        self._said_unresumable = say_unresumable(trainer, self._said_unresumable)

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        say_resuming(checkpoint)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.engine.bound:
            self.engine.end_fit()  # however training ended: max_steps, EarlyStopping, max_time, an interruption
            self.engine.record.stop_clock()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        summary = self.summary(trainer)
        if summary["steps_total"] == 0 and "stepped_aside" not in summary:  # `max_epochs=0`, or no optimizer
            return
        directory = self.summary_dir
        if directory is None and trainer.loggers:
            directory = trainer.log_dir  # a broadcast: every rank must ask
        if directory is not None and trainer.is_global_zero:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, self.summary_filename), "w") as f:
                json.dump(summary, f, indent=2)
        info(self.report(summary))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.engine.unbind()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if stage == "fit" and self._strategy is not None:
            self._strategy.attach_step_handler(None)
            self._strategy = None

    def summary(self, trainer: pl.Trainer | None = None) -> dict[str, Any]:
        """Whole-run numbers, as written to ``hybrid_summary.json``; with ``trainer``, also what its other
        callbacks report through a ``hybrid_summary()`` method (the :class:`VRAMLogger`'s memory peaks)."""
        out = self.engine.summary()
        for callback in trainer.callbacks if trainer is not None else ():
            if callback is not self and callable(getattr(callback, "hybrid_summary", None)):
                out.update(callback.hybrid_summary())
        return out

    def report(self, summary: dict[str, Any] | None = None) -> str:
        """The end-of-fit text: the steps, what the mode did in its own words, the guard's skips and the clock."""
        summary = self.summary() if summary is None else summary
        return format_summary(summary, self.engine.family.report(summary), self.engine.record.this_fit())

    @override
    def _state(self) -> dict[str, Any]:
        return {**self.engine.state_dict(), UNVERIFIED: self.engine.unverified}

    @override
    def _load(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)

    @override
    def _migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        if version == 1:
            state = self.engine.migrate_v1(state)
        return {UNVERIFIED: False, **state}  # version 2 kept the flag at the checkpoint's top level


def find_scheduler(trainer: pl.Trainer) -> HybridScheduler | None:
    """The trainer's :class:`HybridScheduler`, or ``None`` for a plain run."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, HybridScheduler)), None)
