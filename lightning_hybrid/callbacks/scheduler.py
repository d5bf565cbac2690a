"""HybridScheduler: the plugin in one callback, running the :class:`~lightning_hybrid.engine.HybridEngine` inside
``fit`` from Lightning's hooks alone beside any strategy: a step's loss from ``on_before_backward``, its guard from
``on_before_optimizer_step`` (before clipping and the update), its end from ``on_train_batch_end``, torch's step
hooks for the rest (``engine/step_hooks.py``). It holds its components, logs its scalars and checkpoints its state,
so a resumed run continues exactly; a hybrid strategy also hands it the per-step mode's predicted steps."""

from __future__ import annotations

from typing import Any

from typing_extensions import Unpack, override

from lightning_hybrid.callbacks.assembly import assemble, fit_parts
from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.checkpoint_flag import UNVERIFIED, say_resuming, say_unverified
from lightning_hybrid.callbacks.evaluated_weights import write_weights
from lightning_hybrid.callbacks.held_components import COMPONENTS, gather, held, held_states, load_held
from lightning_hybrid.callbacks.messages import info, warn
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.progress import show_progress
from lightning_hybrid.callbacks.ranks import TrainerCollectives
from lightning_hybrid.callbacks.resumable import say_unresumable
from lightning_hybrid.callbacks.scalars import log_step, log_unverified, logging_step, write_summary
from lightning_hybrid.callbacks.sharded_state import stow, unstow
from lightning_hybrid.callbacks.wiring import (
    fit_runs,
    last_step,
    refuse_optimizers,
    refuse_sparse_gradients,
    warn_short_fit,
    what_it_goes_without,
)
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import HybridEngine, OptimizerSet
from lightning_hybrid.engine.state import migrate_v1
from lightning_hybrid.engine.step_hooks import StepHooks
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import AnyPredictor
from lightning_hybrid.setting_owners import DEFAULT_RULE, SchedulerSettings
from lightning_hybrid.step_routing import StepRouting
from lightning_hybrid.summary import RunCounters, format_summary
from lightning_hybrid.tensorboard import write_layout

SUMMARY_FILENAME = "hybrid_summary.json"


class HybridScheduler(HybridComponent):
    """The plugin, in one callback: runs the default rule's cycles and jumps (``outer``), primal averaging
    (``gpa``) or the per-step mode's Warmup → Full → Predict → Correct cycle, and owns the run's record and summary.

    One per Trainer (``hybrid_callbacks()`` holds one). It holds the components its mode needs (``components``), or
    uses those of a kind listed among the Trainer's callbacks; it runs beside the Trainer's strategy, which it only
    reads (the per-step mode needs a hybrid strategy, and says so at setup).

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
        self._listed: list[HybridComponent] = []  # this fit's components the user listed (Lightning holds their state)
        self._sharded = False  # the last fit's parameters were FSDP2 shards: the state is saved per rank
        self._routing: StepRouting | None = None  # the hybrid strategy handing over predicted steps, during a fit
        self._hooks = StepHooks(self.engine)  # torch's step hooks on this fit's optimizers
        self._in_step = False
        self._per_batch, self._seen = 1, 0  # optimizers stepping each batch; the global step last seen
        # this fit said that a checkpoint holds unverified weights, that one will not resume exactly; it trains at all
        self._said_unverified = self._said_unresumable = self._trains = False

    @property
    def phase(self) -> Phase:
        return self.engine.phase

    @property
    def predicting(self) -> bool:
        return self.engine.predicting

    @property
    def counters(self) -> RunCounters:
        return self.engine.record.counters

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self._release()  # what a fit whose exception never reached this callback left
        self._said_unverified = self._said_unresumable = self._trains = False
        parts = fit_parts(trainer, pl_module, self)
        self.predictor, self.monitor, self.bandit = parts.host, parts.monitor, parts.bandit
        self._listed, self._sharded = parts.listed, parts.sharded
        self.engine.connect(parts.components)
        if isinstance(trainer.strategy, StepRouting):  # a hybrid strategy: the per-step mode's predicted steps
            self._routing = trainer.strategy
            self._routing.attach_step_handler(self.engine.route)

    def _release(self) -> None:  # the fit is over, however: nothing of the plugin's left on optimizers or strategy
        self._hooks.remove()
        if self._routing is not None:
            self._routing.attach_step_handler(None)
            self._routing = None

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._trains = True  # a fit with nothing left to train (its max_steps reached) never gets here
        if not any(optimizer.param_groups for optimizer in trainer.optimizers):  # Lightning's stand-in has none
            # plain Lightning trains without an optimizer, with a warning; so does this run
            warn("hybrid: `configure_optimizers` returned no optimizer: the plugin steps aside (plain Lightning).")
            return
        optimizers, family = list(trainer.optimizers), type(self.engine.family)
        refuse_optimizers(optimizers, family, self.predictor.name)
        refuse_sparse_gradients(pl_module)
        # several optimizers on one loss are one trajectory; manual optimization counts a step per optimizer step
        self._per_batch, self._seen = len(optimizers), trainer.global_step
        optimizer = optimizers[0] if len(optimizers) == 1 else OptimizerSet(optimizers)
        start, end = trainer.global_step // self._per_batch, last_step(trainer)
        end = None if end is None else end // self._per_batch
        warn_short_fit(family, self.config, self.predictor.predictor, start, end, self.engine.record.afresh(start))
        self.engine.bind(
            optimizer, TrainerCollectives(trainer.strategy, pl_module, self._sharded),
            automatic=pl_module.automatic_optimization, scaler=getattr(trainer.precision_plugin, "scaler", None),
            global_step=start, world_size=trainer.world_size, buffers=list(pl_module.buffers()), last_step=end,
            logs=bool(trainer.loggers),
        )  # fmt: skip
        self._hooks.attach(optimizers, fit_runs(trainer.state, self.engine))
        write_layout(trainer, self.engine.family.mode)
        if (without := what_it_goes_without(trainer)) is not None:
            warn(without)
        self._in_step = False

    # -- one step --------------------------------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        engine = self.engine
        if not engine.bound:
            return  # a fit the plugin stands aside from
        if engine.evaluating:  # validation saw the average; training goes on from its own point
            engine.evaluate(False)
        if not self._in_step:  # not another micro-batch of an accumulated step
            self._in_step = True
            engine.begin_step()
        if engine.step.phase is Phase.PREDICT:  # counted now: a progress bar ending its batch first sees it
            engine.record.counters.backward_skipped += 1

    @override
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.engine.bound and not self.engine.predicting:
            self.engine.record_loss(loss)

    @override
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.engine.bound:
            self.engine.guard_step()

    def _step_aside(self, reason: str) -> None:
        """The run is not one the plugin can serve: anything unverified undone, the rest of the fit plain, said."""
        warn(f"hybrid: {reason}; the plugin steps aside and the rest of this fit is plain Lightning.")
        self.engine.step_aside(reason)
        self._release()

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
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
        if engine.decided:
            show_progress(trainer, pl_module, engine.family.progress())

    # -- evaluation and checkpoints --------------------------------------------------------------------------------
    @override
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Validation inside ``fit`` sees what the run is evaluated at (an averaging rule's average, until training
        goes on: so do the checkpoints saved after it), and logs ``hybrid/unverified``: 1 where it sees weights a
        verdict may yet undo, else 0."""
        if trainer.state.fn == "fit" and self.engine.bound:
            log_unverified(pl_module, self.engine.unverified)
            self.engine.evaluate(True)

    @override
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        """The checkpoint's weights are what the run is evaluated at; a sharded run's state goes per rank. Said once
        a fit: a checkpoint holds unverified weights, or cannot resume inside its epoch exactly."""
        weights = self.engine.evaluated_weights()
        if weights is not None and "state_dict" in checkpoint:
            write_weights(checkpoint["state_dict"], pl_module, self.engine.store.owners, weights)
        if self._sharded:
            stow(checkpoint, [c.state_key for c in (self, *self._listed)], trainer.global_rank, kept=(UNVERIFIED,))
        said, step = self._said_unverified, trainer.global_step
        self._said_unverified = say_unverified(self.engine.unverified, step, said)
        self._said_unresumable = say_unresumable(trainer, self._said_unresumable)

    @override
    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        """Before Lightning loads the callbacks' states: on a sharded run, this rank's; each component's where its
        holder in this fit finds it."""
        unstow(checkpoint, trainer.ckpt_path, trainer.global_rank)
        say_resuming(checkpoint)
        gather(checkpoint, self.state_key, held(self.components, self._listed), self._listed)

    # -- the fit's end -------------------------------------------------------------------------------------------
    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.engine.bound:
            self.engine.end_fit()  # however training ended: max_steps, EarlyStopping, max_time, an interruption
            self.engine.record.stop_clock()

    @override
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        summary = self.summary(trainer)
        if not self._trains or (summary["steps_total"] == 0 and "stepped_aside" not in summary):  # no optimizer
            return
        write_summary(trainer, summary, self.summary_dir, self.summary_filename)
        info(self.report(summary))

    @override
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._release()
            self.engine.unbind()

    @override
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._release()  # a fit that failed tears its callbacks down only in part

    def summary(self, trainer: Any = None) -> dict[str, Any]:
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
        own = held_states(held(self.components, self._listed))
        return {**self.engine.state_dict(), UNVERIFIED: self.engine.unverified, COMPONENTS: own}

    @override
    def _load(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)
        load_held(held(self.components, self._listed), state[COMPONENTS])

    @override
    def _migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        if version == 1:
            state = migrate_v1(state, self.engine.family)
        # version 2 kept the flag at the checkpoint's top level; up to 3 every component was a callback of its own
        return {UNVERIFIED: False, COMPONENTS: {}, **state}
