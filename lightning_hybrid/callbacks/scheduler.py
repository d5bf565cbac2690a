"""HybridScheduler: the plugin in one callback, which runs the :class:`~lightning_hybrid.engine.HybridEngine` inside
``fit``: it finds or brings the components, hands the engine to the strategy (which routes each step through it),
calls it from Lightning's batch hooks, logs its scalars and checkpoints its state, so a resumed run continues
exactly."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.optim import Optimizer
from typing_extensions import Unpack, override

from lightning_hybrid.adopted import adopt, give_back, what_it_goes_without
from lightning_hybrid.callbacks.assembly import assemble, find_parts
from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.checkpoint_flag import UNVERIFIED, say_resuming, say_unverified
from lightning_hybrid.callbacks.messages import info, warn
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.progress import hide_progress, show_progress
from lightning_hybrid.callbacks.resumable import say_unresumable
from lightning_hybrid.callbacks.routing import DEFAULT_RULE, SchedulerSettings
from lightning_hybrid.callbacks.scalars import log_step, log_unverified, logging_step, write_summary
from lightning_hybrid.callbacks.wiring import (
    last_step,
    refuse_sparse_gradients,
    refuse_untrainable,
    warn_ignored,
    warn_short_fit,
)
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import Components, HybridEngine, OptimizerSet
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import AnyPredictor
from lightning_hybrid.summary import RunCounters, format_summary
from lightning_hybrid.tensorboard import write_layout

SUMMARY_FILENAME = "hybrid_summary.json"


class HybridScheduler(HybridComponent):
    """The plugin, in one callback: runs the default rule's cycles and jumps (``outer``), primal averaging
    (``gpa``) or the per-step mode's Warmup → Full → Predict → Correct cycle, and owns the run's record and summary.

    It brings the components its mode needs (``components``, placed among the callbacks at setup where none of that
    kind is listed) and runs beside the Trainer's strategy, which takes the plugin's step routing for the fit
    (:mod:`~lightning_hybrid.adopted`); the per-step mode needs a hybrid strategy, and says so at setup.

    Args:
        config: the phase settings, as a :class:`HybridConfig`; or give them as keywords.
        summary_filename: name of the JSON summary written at the end of a ``fit`` that trained.
        summary_dir: the folder it goes to; by default where the Trainer's first logger keeps its logs
            (``trainer.log_dir``), and nowhere without a logger (the summary is still printed).
        predictor: a registered name (``outer``, the default; ``gpa``; the per-step ``linear``, ``mlp`` and
            ``rssm``) or a :class:`Predictor` or :class:`TrajectoryRule` instance.
        bandit: whether to bring the :class:`HorizonBandit`; by default (``None``) for the per-step predictors.
        **settings: every setting, given to the component that owns it: the phase settings
            (:class:`HybridConfig`), the divergence monitor's, the corrector's, the bandit's, ``feature_dim`` and
            the named predictor's own (``outer_lr``, ``keep_norms``, ...). An unknown name raises ``TypeError`` with
            the closest known ones; a setting the chosen mode does not read is checked by its owner and warned about,
            once. Every one is listed in ``docs/settings.md``.
    """

    runs_the_plugin = True

    def __init__(
        self,
        config: HybridConfig | None = None,
        summary_filename: str = SUMMARY_FILENAME,
        summary_dir: str | None = None,
        *,
        predictor: str | AnyPredictor = DEFAULT_RULE,
        bandit: bool | None = None,
        **settings: Unpack[SchedulerSettings],
    ) -> None:
        built = assemble(config, predictor, bandit, dict(settings))
        self.config, self.components, self.given = built.config, built.components, built.given
        self.rule_settings = built.rule_settings  # the named predictor's own settings
        self.told_ignored = built.told_ignored  # settings already warned about as not read by the mode
        self.summary_filename, self.summary_dir = summary_filename, summary_dir
        self.engine = HybridEngine(self.config, info=info, warn=warn)  # said beside the progress bar
        self.predictor: DynamicsPredictor | None = None  # the components found at setup
        self.monitor: DivergenceMonitor | None = None
        self.bandit: HorizonBandit | None = None
        self._strategy: Any = None
        self._strategy_class: type | None = None  # the user's strategy's own class, while it routes for the plugin
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
        """What the progress bar shows: the phase, and the mode's counts (jumps kept, or backward passes skipped)."""
        family = self.engine.family
        return {"phase": self.phase.label, **(family.progress() if family is not None else {})}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._said_unverified = self._said_unresumable = False
        self.predictor, family, corrector, self.monitor, self.bandit = find_parts(trainer, self)
        refuse_untrainable(pl_module)
        self._strategy_class = adopt(trainer.strategy, self.predictor.name if family.predicts_steps else None)
        self._strategy = trainer.strategy  # routing for the plugin until given back
        bandit = self.bandit.horizons if self.bandit is not None else None
        host, monitor = self.predictor, self.monitor.divergence
        parts = Components(host.predictor, host.encoder, corrector, monitor, bandit)
        try:  # what the family cannot run with, refused by name before training
            family.check(self.config, parts, trainer.strategy.sharded)
        except ValueError as err:
            raise MisconfigurationException(str(err)) from err
        warn_ignored(family, self.predictor.name, self.config, self.monitor.divergence, self.told_ignored)
        self.engine.connect(parts)
        trainer.strategy.attach_step_handler(self.engine)
        show_progress(trainer, self)

    def _release(self, trainer: pl.Trainer) -> None:
        """The fit is over, however it ended: the strategy and the progress bar are as the user made them."""
        hide_progress(trainer)
        if self._strategy is not None:
            give_back(self._strategy, self._strategy_class)
        self._strategy = self._strategy_class = None

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
        clips = bool(trainer.gradient_clip_val) and trainer.gradient_clip_algorithm in (None, "norm")
        self.engine.step_guard.for_clipping = clips  # Lightning's clipping by norm takes the guard's measurement
        pre, post = self._before_optimizer_step, self._after_optimizer_step
        self._hooks = [h for o in optimizers for h in (o.register_step_pre_hook(pre), o.register_step_post_hook(post))]
        write_layout(trainer, self.engine.family.mode)
        if self._strategy_class and (without := what_it_goes_without(trainer, self._strategy_class)) is not None:
            warn(without)
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
            log_step(trainer, engine.metrics(predicted_loss))

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Validation inside a segment, or between a jump and its verdict, sees unverified weights: each validation
        of a fit logs ``hybrid/unverified`` (1 there, else 0), so a reader knows which points may yet be undone."""
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
        write_summary(trainer, summary, self.summary_dir, self.summary_filename)
        info(self.report(summary))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.engine.unbind()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if stage == "fit":
            self._release(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release(trainer)  # a fit that failed tears its callbacks down only in part

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
