"""HybridScheduler: the phase engine behind the hybrid strategy.

The strategy hands each training step, backward and optimizer step to this callback, which decides what the
step does: an ordinary step (guarded against non-finite losses, with the actual update captured for the
predictor) or a predicted step (no backward, update applied in place, watched by the divergence monitor).
Living in a callback, all of its state is checkpointed by Lightning, so a run resumed in any phase continues
exactly as the uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.optim import Optimizer

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.offload import OptimizerStateOffload, host_like
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import Plan
from lightning_hybrid.stats import sq_norm
from lightning_hybrid.summary import RunCounters, format_summary
from lightning_hybrid.tensorboard import write_phase_curves_layout

SUMMARY_FILENAME = "hybrid_summary.json"


def _loss_of(output: Any) -> Tensor | None:
    """The loss inside a ``training_step`` output (a tensor, a dict with ``"loss"``, or ``None``)."""
    if isinstance(output, Mapping):
        output = output.get("loss")
    return output.detach().float() if isinstance(output, Tensor) else None


class HybridScheduler(HybridComponent):
    """Runs the Warmup → Full → Predict → Correct cycle and owns the rollback snapshot and run summary.

    The Predict horizon starts at ``max_predict_steps``, halves after every failed segment (rollback or invalid
    plan) and doubles, up to ``max_predict_steps``, after every accepted one.

    Args:
        config: the phase settings; alternatively pass them as keyword arguments (see :class:`HybridConfig`).
        summary_filename: name of the JSON summary written into ``trainer.log_dir`` at the end of ``fit``.
    """

    def __init__(
        self, config: HybridConfig | None = None, summary_filename: str = SUMMARY_FILENAME, **settings: Any
    ) -> None:
        if config is not None and settings:
            raise ValueError(f"HybridScheduler: pass either `config` or settings, not both (got {sorted(settings)})")
        self.config = config if config is not None else HybridConfig(**settings)
        self.summary_filename = summary_filename
        self.counters = RunCounters()
        self.phase = Phase.WARMUP if self.config.warmup_steps > 0 else Phase.FULL
        self._phase_step = 0
        self._plan: Plan | None = None
        self._segment_pos = 0
        self._snapshot_alive = False
        self._horizon = self.config.max_predict_steps
        self._consecutive_rollbacks = 0
        self._prediction_off = False
        self._declined = 0  # Full cycles in a row that ended without a segment
        self._backoffs = 0  # back-offs since the last accepted segment; each doubles the pause
        self._backoff_until = 0  # no update capture before this global step
        self._lr_ref: list[float] = []
        self._lr_peak: list[float] = []  # each group's highest learning rate so far, for `predict_lr_fraction`
        self._pending_snapshot: list[Tensor] | None = None
        self._components: dict[type, HybridComponent] = {}
        self.bandit: HorizonBandit | None = None
        self._factors: list[float] = []
        self._bandit_arm = 0
        self._errors = {"sum": 0.0, "count": 0}
        self.summary_extras: dict[str, Any] = {}  # what other callbacks add to the summary (e.g. memory peaks)
        # run wiring, set in setup / on_train_start
        self._strategy: pl.strategies.Strategy | None = None
        self._optimizer: Optimizer | None = None
        self._groups: list[list[Tensor]] = []
        self._group_index: list[int] = []
        self._params: list[Tensor] = []
        self._buffer: list[Tensor] = []
        self._host_snapshot: list[Tensor] = []  # predict_memory="aggressive": the rollback snapshot, on the host
        self._snapshot_on_host = False
        self._offload: OptimizerStateOffload | None = None
        self._buffer_groups: list[list[Tensor]] = []
        self._hooks: list[Any] = []
        self._automatic = True
        self._scaler: Any = None
        self._last_global_step = 0
        self._wall_base = 0.0
        self._wall_t0 = 0.0
        self._reset_step()

    # ------------------------------------------------------------------------------------------------ wiring
    @property
    def predictor(self) -> DynamicsPredictor:
        return self._components[DynamicsPredictor]

    @property
    def corrector(self) -> ResidualCorrector:
        return self._components[ResidualCorrector]

    @property
    def monitor(self) -> DivergenceMonitor:
        return self._components[DivergenceMonitor]

    @property
    def predicting(self) -> bool:
        return self.phase is Phase.PREDICT

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        present = sorted(type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, HybridComponent))
        self._components = {}
        for kind in (DynamicsPredictor, ResidualCorrector, DivergenceMonitor):
            matches = [cb for cb in trainer.callbacks if isinstance(cb, kind)]
            if len(matches) != 1:
                raise MisconfigurationException(
                    f"HybridScheduler needs exactly one {kind.__name__} callback, found {len(matches)} "
                    f"(hybrid callbacks present: {present}). Use `callbacks=hybrid_callbacks(...)`."
                )
            self._components[kind] = matches[0]
        bandits = [cb for cb in trainer.callbacks if isinstance(cb, HorizonBandit)]
        if len(bandits) > 1:
            raise MisconfigurationException(f"HybridScheduler takes at most one HorizonBandit, found {len(bandits)}.")
        self.bandit = bandits[0] if bandits else None
        if not any(p.requires_grad for p in pl_module.parameters()):
            raise ValueError(
                f"{type(pl_module).__name__} has no trainable parameters (none with requires_grad=True); "
                "hybrid training needs at least one."
            )
        if trainer.strategy.sharded and self.config.predict_memory != "none":  # a hybrid strategy: checked above
            raise MisconfigurationException(
                f"predict_memory={self.config.predict_memory!r} is not supported with "
                f"{type(trainer.strategy).__name__}: its optimizer state is already sharded; use predict_memory='none'."
            )
        self._strategy = trainer.strategy
        trainer.strategy.attach_scheduler(self)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException(
                f"Hybrid training supports exactly one optimizer (several param groups are fine); "
                f"`configure_optimizers` returned {len(trainer.optimizers)}."
            )
        optimizer = trainer.optimizers[0]
        groups = [[p for p in group["params"] if p.requires_grad] for group in optimizer.param_groups]
        self._group_index = [i for i, group in enumerate(groups) if group]
        if not self._group_index:
            raise ValueError("The optimizer holds no trainable parameters; hybrid training needs at least one.")
        self._optimizer = optimizer
        self._offload = OptimizerStateOffload(optimizer) if self.config.predict_memory != "none" else None
        self._owners = [p for i in self._group_index for p in groups[i]]  # the parameters, holding `.grad`
        local = self._strategy.local_tensor  # under FSDP, this rank's shard: prediction never gathers
        self._groups = [[local(p) for p in groups[i]] for i in self._group_index]
        self._params = [p for group in self._groups for p in group]
        self._allocate_buffer()
        if self._pending_snapshot is not None:
            self._copy(self._buffer, [t.to(b.device) for t, b in zip(self._pending_snapshot, self._buffer)])
            self._pending_snapshot = None
        self.predictor.predictor.sum_across_ranks = self._strategy.sum_across_ranks
        self.predictor.predictor.setup(self._groups, self.predictor.encoder.dim)
        if self.bandit is not None:
            self.bandit.setup_arms(self.config.max_predict_steps, self.predictor.encoder.dim)
        if not self._lr_ref:
            self._lr_ref = self._current_lrs()
        if not self._lr_peak:
            self._lr_peak = self._current_lrs()
        self._hooks = [
            optimizer.register_step_pre_hook(self._before_optimizer_step),
            optimizer.register_step_post_hook(self._after_optimizer_step),
        ]
        write_phase_curves_layout(trainer)
        self._automatic = pl_module.automatic_optimization
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._last_global_step = trainer.global_step
        self._wall_t0 = time.perf_counter()
        self._reset_step()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._wall_base, self._wall_t0 = self._wall_time(), 0.0  # stop the clock

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        summary = self.summary()
        directory = trainer.log_dir or trainer.default_root_dir  # a broadcast: every rank must ask
        if trainer.is_global_zero:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, self.summary_filename), "w") as f:
                json.dump(summary, f, indent=2)
        rank_zero_info(format_summary(summary))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._offload is not None:  # a fit that ended inside a segment leaves the state on its device
            self._offload.restore()
            self._offload.wait()
            self._offload = None
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._buffer, self._buffer_groups = [], [], []
        self._groups, self._params, self._optimizer = [], [], None
        if stage == "fit" and self._strategy is not None:
            self._strategy.attach_scheduler(None)
            self._strategy = None

    # ----------------------------------------------------------------------------------- called by strategy
    def predicted_training_step(self, run: Callable[[], Any]) -> Any:
        """``training_step`` during Predict: a ``no_grad`` forward when one is due, otherwise none at all."""
        if self._automatic and not self._forward_now:
            # Lightning needs a tensor (``None`` is refused under DDP): hand it the predicted loss.
            return torch.tensor(self._plan.loss[self._segment_pos], device=self._strategy.root_device)
        with torch.no_grad(), self._predict_autocast():
            output = run()
        if self._automatic:
            self._forward_loss = _loss_of(output)
        return output

    def _predict_autocast(self) -> Any:
        if self.config.predict_precision == "bf16":
            return torch.autocast(self._strategy.root_device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def record_loss(self, loss: Tensor) -> None:
        """Loss passed to ``backward`` (summed over accumulated micro-batches)."""
        loss = loss.detach().float()
        if self.predicting:
            if not self._automatic:  # automatic Predict steps record their loss in `predicted_training_step`
                self._forward_loss = loss if self._forward_loss is None else self._forward_loss + loss
        else:
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self.counters.backward_passes += 1

    def guard(self, optimizer: Optimizer, closure: Callable[[], Any]) -> Callable[[], Any]:
        """Wrap an ordinary step's closure so a non-finite loss or gradient never reaches the weights."""

        def guarded() -> Any:
            output = closure()
            if self._offload is not None:
                self._offload.wait()  # optimizer state copied back after a segment: the update reads it next
            self._check_ordinary_step(optimizer)
            return output

        return guarded

    def predict_step(self, closure: Callable[[], Any]) -> Any:
        """One predicted optimizer step: optional forward check, then the predicted update in place."""
        h = self._segment_pos
        self._step_predicted_loss = self._plan.loss[h]
        self._step_band = self._plan.loss_upper[h] - self._plan.loss[h]
        every = self.config.predict_forward_every
        self._forward_now = every > 0 and h > 0 and h % every == 0
        try:
            with torch.no_grad():
                output = closure()
        finally:
            self._forward_now = False
        if self._forward_loss is not None:
            self._step_loss = self._reduce([self._forward_loss])[0]
            reason = self.monitor.check(self._step_loss, self._plan.loss_upper[h])
            if reason is not None:
                self._rollback(reason)
                return output
            self._plan = self.corrector.reanchor(self._plan, h, self._step_loss)
        self._apply_prediction(h)
        self._segment_pos += 1
        return output

    # ----------------------------------------------------------------------------------------- step logic
    def _reset_step(self) -> None:
        self._in_step = False
        self._step_phase = self.phase
        self._t0 = 0.0
        self._loss_sum: Tensor | None = None
        self._forward_loss: Tensor | None = None
        self._forward_now = False
        self._capture = False
        self._step_backed_off = False
        self._delta_ready = False
        self._skipped = False
        self._step_loss = math.nan
        self._step_predicted_loss = math.nan
        self._step_band = math.nan  # half-width of the predicted loss's band, on predicted steps
        self._step_error = math.nan
        self._grad_norm = math.nan

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        if self._in_step:
            return  # another micro-batch of an accumulated step
        self._reset_step()
        self._in_step = True
        self._t0 = time.perf_counter()
        self._step_backed_off = self.phase.ordinary and self._backed_off
        self._capture = self.phase.ordinary and not self._snapshot_alive and not self._step_backed_off

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if self._step_phase is Phase.PREDICT:
            self.counters.backward_skipped += 1
        if trainer.global_step == self._last_global_step:
            return  # accumulating: the optimizer has not stepped yet
        self._last_global_step = trainer.global_step
        self._lr_peak = [max(peak, lr) for peak, lr in zip(self._lr_peak, self._current_lrs())]
        self._end_step(trainer)
        self._in_step = False

    def _before_optimizer_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        if self._capture:
            self._copy(self._buffer, self._params)

    def _after_optimizer_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        if self._capture:
            with torch.no_grad():
                torch._foreach_sub_(self._buffer, self._params)
                torch._foreach_neg_(self._buffer)  # buffer := new - old
            self._delta_ready = True

    def _check_ordinary_step(self, optimizer: Optimizer) -> None:
        local = self._strategy.local_tensor
        grads = [local(p.grad) for p in self._owners if p.grad is not None]
        if self._loss_sum is None and not grads:
            self._skipped = True  # the user's training_step skipped this batch
            return
        device = self._strategy.root_device
        loss = self._loss_sum if self._loss_sum is not None else torch.full((), math.nan, device=device)
        grad_sq = sq_norm(grads) if grads else torch.zeros((), device=device)
        grad_norm = self._strategy.sum_across_ranks(grad_sq).sqrt()
        loss_v, grad_norm_v = self._reduce([loss, grad_norm])  # a mean is non-finite if any rank's value is
        bad = not (math.isfinite(loss_v) and math.isfinite(grad_norm_v))
        if self._scaler is not None:
            grad_norm_v /= float(self._scaler.get_scale())
        self._step_loss, self._grad_norm = loss_v, grad_norm_v
        if self._snapshot_alive:  # first Correct step: the loss at the segment's final weights verifies it
            reason = self.monitor.check(math.nan if bad else loss_v, self._plan.loss_upper[-1])
            if reason is not None:
                self._skip_update(optimizer, grads)
                self._rollback(reason)
                return
            self._accept_segment()
        if bad:
            self._skip_update(optimizer, grads)
            self.counters.nonfinite_steps_skipped += 1
        elif self.monitor.gradient_outlier(grad_norm_v):
            self._skip_update(optimizer, grads)
            self.counters.outlier_steps_skipped += 1

    def _skip_update(self, optimizer: Optimizer, grads: list[Tensor]) -> None:
        """Make the coming ``optimizer.step`` a no-op."""
        self._skipped = True
        if self._scaler is not None:
            torch._foreach_mul_(grads, math.nan)  # the scaler skips steps with non-finite gradients
        else:
            optimizer.zero_grad(set_to_none=True)  # optimizers skip parameters without gradients

    def _end_step(self, trainer: pl.Trainer) -> None:
        phase = self._step_phase
        seconds = time.perf_counter() - self._t0
        self.counters.steps_by_phase[phase.label] += 1
        self.counters.time_by_phase_s[phase.label] += seconds
        step = trainer.global_step
        predicted_loss = self._step_predicted_loss
        self._step_error = math.nan
        if phase.ordinary and not self._skipped and math.isfinite(self._step_loss):
            predicted_loss = self._observe(step, phase)
        if self.bandit is not None:
            if self.bandit.cost == "wall" and trainer.world_size > 1:  # every rank must see the same costs
                seconds = self._reduce([torch.tensor(seconds)])[0]
            loss = self._step_loss if phase.ordinary and not self._skipped else None
            self.bandit.record_step(phase is Phase.PREDICT, seconds, loss, correcting=phase is Phase.CORRECT)
        if self._step_backed_off:
            self.counters.backed_off_steps += 1
        if self.phase is phase and phase.ordinary:
            self._phase_step += 1
        self._advance()
        self._log(trainer, phase, predicted_loss)

    def _observe(self, step: int, phase: Phase) -> float:
        """Feed an ordinary step to the monitor, predictor, corrector and encoder; return the predicted loss."""
        loss, encoder = self._step_loss, self.predictor.encoder
        if phase is not Phase.CORRECT:
            self.monitor.observe(loss, self._grad_norm)
        deltas = self._buffer_groups if self._delta_ready else None
        features = encoder.features() if deltas is not None else None  # the state before this step
        stats = self.predictor.predictor.observe(step, loss, deltas, features)
        lrs = self._current_lrs()
        self._lr_ref = lrs
        if stats is None:
            if self._step_backed_off:  # the features are refreshed when observation resumes, before any segment
                encoder.observe_loss(step, loss, self._grad_norm)
            else:
                encoder.observe(step, loss, self._grad_norm, lrs)
            return math.nan
        factors, _ = self.corrector.correction(features, step, len(self._groups))
        self._step_error = stats.scaled(factors).relative_error  # the error of the corrected prediction
        self._errors["sum"] += self._step_error
        self._errors["count"] += 1
        if phase is Phase.CORRECT:
            self.corrector.observe(step, stats, features)
        encoder.observe(
            step, loss, self._grad_norm, lrs, stats.actual_sq, self._step_error, loss - stats.predicted_loss
        )
        return stats.predicted_loss

    def _advance(self) -> None:
        cfg = self.config
        if self.phase is Phase.WARMUP and self._phase_step >= cfg.warmup_steps:
            self._enter(Phase.FULL)
        elif self.phase is Phase.FULL and self._step_backed_off:
            self._phase_step = 0  # a fresh Full cycle of observation follows the back-off
        elif self.phase is Phase.FULL and self._phase_step >= cfg.full_steps:
            if not self._try_start_segment():
                self._decline()
        elif self.phase is Phase.PREDICT and self._segment_pos >= self._plan.horizon:
            self._end_segment_memory()
            self._enter(Phase.CORRECT)
        elif self.phase is Phase.CORRECT and self._phase_step >= cfg.correction_steps:
            if self.bandit is not None:
                self.bandit.finish()
            self._enter(Phase.FULL)

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self._phase_step = 0

    @property
    def _backed_off(self) -> bool:
        """Whether ordinary steps currently skip update capture and predictor training."""
        cfg = self.config
        if not cfg.enable_prediction or self._prediction_off or self._last_global_step < self._backoff_until:
            return True
        limit = cfg.predict_lr_fraction
        return limit < 1.0 and any(lr > limit * peak for lr, peak in zip(self._current_lrs(), self._lr_peak))

    def _decline(self) -> None:
        """A Full cycle ended without a segment; after ``backoff_after`` in a row, stop observing for a while.
        Once backed off (and until a segment is accepted), the first declined cycle after a pause starts the next,
        longer one: the predictor has already shown it does not earn confidence here."""
        self._declined += 1
        after = self.config.backoff_after
        if after and (self._declined >= after or self._backoffs > 0):
            self._backoff_until = self._last_global_step + self.config.full_steps * 2 ** min(self._backoffs, 5)
            self._backoffs += 1
            self._declined = 0

    def _try_start_segment(self) -> bool:
        """Start a Predict segment if the predictor, its confidence and the bandit allow it."""
        self._phase_step = 0  # another Full cycle unless a segment starts
        cfg = self.config
        predictor = self.predictor.predictor
        if not predictor.ready or predictor.confidence() < cfg.confidence_threshold:
            return False
        encoder = self.predictor.encoder
        features = encoder.features()
        horizon = self._horizon
        if self.bandit is not None:
            arm = self.bandit.choose(features)
            horizon = self.bandit.arms[arm]
            self._bandit_arm = horizon
            if horizon == 0:  # the bandit prefers another Full cycle: that is the baseline, reward 0
                self.bandit.update(arm, features, 0.0)
                return False
            _, slope, noise = encoder.loss_trend()
            self.bandit.begin(arm, features, slope, noise)
        plan, self._factors = self.corrector.correct(
            predictor.plan(horizon, features), features, self._last_global_step
        )
        if not self._plan_is_valid(plan, predictor.directions()):
            self.counters.invalid_plans += 1
            self._count_failed_segment()
            return False
        self._take_snapshot()
        self._snapshot_alive = True
        self._plan = plan
        self._segment_pos = 0
        self.counters.segments_started += 1
        self.monitor.start_segment()
        self._declined = 0
        self._enter(Phase.PREDICT)
        return True

    def _plan_is_valid(self, plan: Plan, directions: Any) -> bool:
        if plan.horizon < 1 or not plan.is_finite() or len(plan.loss_upper) != plan.horizon + 1:
            return False
        if len(directions) != len(self._groups) or any(len(row) != len(self._groups) for row in plan.scales):
            return False
        for group, dirs in zip(self._groups, directions):
            if [tuple(p.shape) for p in group] != [tuple(d.shape) for d in dirs]:
                return False
        norms = self._strategy.sum_across_ranks(torch.stack([sq_norm(list(d)) for d in directions]))
        return bool(torch.isfinite(norms).all())  # a non-finite shard on any rank invalidates the plan everywhere

    def _apply_prediction(self, h: int) -> None:
        lrs = self._current_lrs()
        with torch.no_grad():
            for g, (params, directions) in enumerate(zip(self._groups, self.predictor.predictor.directions())):
                ratio = lrs[g] / self._lr_ref[g] if self._lr_ref[g] > 0 else 0.0
                alpha = self._plan.scales[h][g] * ratio
                if alpha != 0.0:
                    torch._foreach_add_(params, list(directions), alpha=alpha)
        self._strategy.parameters_changed()

    def _rollback(self, reason: str) -> None:
        self._end_segment_memory()  # a no-op unless a segment's optimizer state is still offloaded
        self._copy(self._params, self._host_snapshot if self._snapshot_on_host else self._buffer)
        self._strategy.parameters_changed()
        self._release_snapshot()
        self.counters.rollbacks += 1
        self.counters.predicted_steps_rolled_back += self._segment_pos
        self._count_failed_segment()
        rank_zero_info(f"hybrid: rolled back a predicted segment after {self._segment_pos} steps ({reason})")
        self._enter(Phase.FULL)

    def _count_failed_segment(self) -> None:
        if self.bandit is not None:
            self.bandit.abort()
        self._consecutive_rollbacks += 1
        self._horizon = max(1, self._horizon // 2)
        if self._consecutive_rollbacks >= self.config.max_consecutive_rollbacks and not self._prediction_off:
            self._prediction_off = True
            rank_zero_warn(
                f"hybrid: {self._consecutive_rollbacks} predicted segments failed in a row; prediction is off for "
                "the rest of this run, which continues as plain training."
            )

    def _accept_segment(self) -> None:
        self._release_snapshot()
        self._consecutive_rollbacks = 0
        self._backoffs = 0
        self._horizon = min(self.config.max_predict_steps, self._horizon * 2)
        self.counters.segments_accepted += 1

    # --------------------------------------------------------------------------------------------- memory
    def _allocate_buffer(self) -> None:
        """The device buffer that holds each ordinary step's update and, between segments' start and
        verification, the rollback snapshot."""
        self._buffer = [torch.empty_like(p) for p in self._params]
        sizes = [len(group) for group in self._groups]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self._buffer_groups = [self._buffer[s : s + n] for s, n in zip(starts, sizes)]

    def _take_snapshot(self) -> None:
        """Start of a segment: snapshot the weights and free what Predict does not need (``predict_memory``)."""
        mode = self.config.predict_memory
        if mode == "aggressive":
            if not self._host_snapshot:
                self._host_snapshot = [host_like(p) for p in self._params]
            self._copy(self._host_snapshot, self._params)
            self._snapshot_on_host = True
            self._buffer, self._buffer_groups = [], []
        else:
            self._copy(self._buffer, self._params)
        if mode != "none":
            self._optimizer.zero_grad(set_to_none=True)
            self._offload.offload()

    def _end_segment_memory(self) -> None:
        """Predicted steps are over: bring the optimizer state back in time for the next update."""
        if self._offload is not None:
            self._offload.restore()

    def _release_snapshot(self) -> None:
        self._snapshot_alive = False
        if self._snapshot_on_host:
            self._snapshot_on_host = False
            self._allocate_buffer()

    # -------------------------------------------------------------------------------------------- helpers
    @staticmethod
    def _copy(dst: list[Tensor], src: list[Tensor]) -> None:
        with torch.no_grad():
            torch._foreach_copy_(dst, src)

    def _reduce(self, values: list[Tensor]) -> list[float]:
        """Average scalars over ranks (identity on one device), so every rank takes the same decision."""
        device = self._strategy.root_device
        stacked = torch.stack([v.to(device=device, dtype=torch.float32) for v in values])
        return self._strategy.reduce(stacked, reduce_op="mean").tolist()

    def _current_lrs(self) -> list[float]:
        groups = self._optimizer.param_groups
        return [float(groups[i]["lr"]) for i in self._group_index]

    def _wall_time(self) -> float:
        return self._wall_base + (time.perf_counter() - self._wall_t0 if self._wall_t0 else 0.0)

    def _log(self, trainer: pl.Trainer, phase: Phase, predicted_loss: float) -> None:
        if not trainer.loggers:
            return
        metrics = {
            "hybrid/phase": float(phase),
            "hybrid/confidence": self.predictor.predictor.confidence(),
            "hybrid/horizon": float(self._plan.horizon if phase is Phase.PREDICT else 0),
            "hybrid/rollbacks": float(self.counters.rollbacks),
            "hybrid/backward_skipped_pct": self.counters.backward_skipped_pct,
        }
        if math.isfinite(self._step_loss):
            metrics["hybrid/loss"] = self._step_loss
        if math.isfinite(predicted_loss):
            metrics["hybrid/loss_predicted"] = predicted_loss
            if math.isfinite(self._step_band):
                metrics["hybrid/loss_predicted_lower"] = predicted_loss - self._step_band
                metrics["hybrid/loss_predicted_upper"] = predicted_loss + self._step_band
        if math.isfinite(self._step_error):
            metrics["hybrid/prediction_error"] = self._step_error
        metrics["hybrid/correction_magnitude"] = max((abs(math.log(f)) for f in self._factors), default=0.0)
        metrics["hybrid/uncertainty"] = self.predictor.predictor.uncertainty()
        if self.bandit is not None:
            metrics["hybrid/bandit_arm"] = float(self._bandit_arm)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def summary(self) -> dict[str, Any]:
        """Whole-run numbers, as written to ``hybrid_summary.json``."""
        out = self.counters.summary()
        out["wall_time_s"] = round(self._wall_time(), 4)  # training start to end, validation included
        out["rollback_reasons"] = {**self.monitor.events, "invalid_plan": self.counters.invalid_plans}
        out["prediction_disabled"] = self._prediction_off
        out["predictor"] = self.predictor.name
        count = self._errors["count"]
        out["mean_prediction_error"] = self._errors["sum"] / count if count else None
        if self.bandit is not None:
            out["arm_counts"] = {str(arm): n for arm, n in zip(self.bandit.arms, self.bandit.counts)}
        out["final_confidence"] = self.predictor.predictor.confidence()
        out["config"] = self.config.to_dict()
        out.update(self.summary_extras)
        return out

    # ---------------------------------------------------------------------------------------------- state
    def _state(self) -> dict[str, Any]:
        state = {
            "phase": int(self.phase),
            "phase_step": self._phase_step,
            "plan": self._plan.to_dict() if self._plan is not None else None,
            "segment_pos": self._segment_pos,
            "horizon": self._horizon,
            "consecutive_rollbacks": self._consecutive_rollbacks,
            "prediction_off": self._prediction_off,
            "backoff": [self._declined, self._backoffs, self._backoff_until],
            "lr_ref": list(self._lr_ref),
            "lr_peak": list(self._lr_peak),
            "counters": self.counters.to_dict(),
            "factors": list(self._factors),
            "bandit_arm": self._bandit_arm,
            "errors": dict(self._errors),
            "wall_time_s": self._wall_time(),
            "snapshot": None,
        }
        if self._snapshot_alive:
            snapshot = self._host_snapshot if self._snapshot_on_host else self._buffer
            state["snapshot"] = [t.detach().to("cpu", copy=True) for t in snapshot]
        return state

    def _load(self, state: dict[str, Any]) -> None:
        self.phase = Phase(state["phase"])
        self._phase_step = int(state["phase_step"])
        self._plan = Plan.from_dict(state["plan"]) if state["plan"] is not None else None
        self._segment_pos = int(state["segment_pos"])
        self._horizon = int(state["horizon"])
        self._consecutive_rollbacks = int(state["consecutive_rollbacks"])
        self._prediction_off = bool(state["prediction_off"])
        self._declined, self._backoffs, self._backoff_until = (int(v) for v in state["backoff"])
        self._lr_ref = [float(v) for v in state["lr_ref"]]
        self._lr_peak = [float(v) for v in state["lr_peak"]]
        self.counters = RunCounters()
        self.counters.load(state["counters"])
        self._factors, self._bandit_arm = list(state["factors"]), int(state["bandit_arm"])
        self._errors = dict(state["errors"])
        self._wall_base, self._wall_t0 = float(state["wall_time_s"]), 0.0
        self._snapshot_alive = state["snapshot"] is not None
        self._pending_snapshot = state["snapshot"]


def find_scheduler(trainer: pl.Trainer) -> HybridScheduler | None:
    """The trainer's :class:`HybridScheduler`, or ``None`` for a plain run."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, HybridScheduler)), None)
