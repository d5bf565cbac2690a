"""A Predict segment's life: planned at the end of a Full cycle, applied one predicted update at a time, and then
accepted or rolled back. The part of :class:`~.engine.HybridEngine` that moves weights outside optimizer steps."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import Plan
from lightning_hybrid.stats import sq_norm


class SegmentCycle:
    """Segment start, application, rollback and acceptance; mixed into :class:`~.engine.HybridEngine`."""

    def _follow_trainable_set(self) -> bool:
        """At a Full cycle's end, before any segment: if parameters were frozen, unfrozen or added since the last
        check, track the new set from the next cycle: a new capture buffer, and the predictor set up again on the
        new tensors (its per-tensor statistics restart whenever their shapes differ). Returns whether it changed."""
        if not self.store.trainable_changed():
            return False
        store = self.store
        self._build_store(store.optimizer, store.module_buffers)
        lrs = self.store.lrs()
        if len(lrs) != len(self.lr_ref):  # groups came or went: learning-rate references and peaks start again
            self.lr_ref, self.policy.lr_peak = list(lrs), list(lrs)
        return True

    def _try_start_segment(self) -> bool:
        """Start a Predict segment if the predictor, its confidence and the bandit allow it."""
        cfg, parts = self.config, self.parts
        predictor = parts.predictor
        if not predictor.ready or predictor.confidence() < cfg.confidence_threshold:
            return False
        features = parts.encoder.features()
        horizon = self.machine.horizon
        if parts.bandit is not None:
            arm = parts.bandit.choose(features)
            horizon = parts.bandit.arms[arm]
            self.record.bandit_arm = horizon
            if horizon == 0:  # the bandit prefers another Full cycle: that is the baseline, reward 0
                parts.bandit.update(arm, features, 0.0)
                return False
            _, slope, noise = parts.encoder.loss_trend()
            parts.bandit.begin(arm, features, slope, noise)
        plan, self.record.factors = parts.corrector.correct(
            predictor.plan(horizon, features), features, self.global_step
        )
        if not self._plan_is_valid(plan, predictor.directions()):
            self.record.counters.invalid_plans += 1
            self._segment_failed()
            return False
        self.store.take_snapshot()
        self.plan = plan
        self.record.counters.segments_started += 1
        parts.monitor.start_segment()
        self.policy.segment_started()
        self.machine.start_segment()
        return True

    def _plan_is_valid(self, plan: Plan, directions: Any) -> bool:
        groups = self.store.groups
        if plan.horizon < 1 or not plan.is_finite() or len(plan.loss_upper) != plan.horizon + 1:
            return False
        if len(directions) != len(groups) or any(len(row) != len(groups) for row in plan.scales):
            return False
        for group, dirs in zip(groups, directions):
            if [tuple(p.shape) for p in group] != [tuple(d.shape) for d in dirs]:
                return False
        norms = self.collectives.sum_across_ranks(torch.stack([sq_norm(list(d)) for d in directions]))
        return bool(torch.isfinite(norms).all())  # a non-finite shard on any rank invalidates the plan everywhere

    def _apply_prediction(self, h: int) -> None:
        """Predicted step ``h``: each group's direction times its planned scale, rescaled by how the group's
        learning rate has moved since the plan's reference."""
        lrs = self.store.lrs()
        alphas = [
            self.plan.scales[h][g] * (lrs[g] / self.lr_ref[g] if self.lr_ref[g] > 0 else 0.0) for g in range(len(lrs))
        ]
        self.store.add(self.parts.predictor.directions(), alphas)
        self.collectives.parameters_changed()

    def rollback(self, reason: str) -> None:
        """Put the weights back where the segment started, and count the failure."""
        self.store.rollback()
        self.collectives.parameters_changed()
        counters = self.record.counters
        counters.rollbacks += 1
        counters.predicted_steps_rolled_back += self.machine.segment_pos
        self._segment_failed()
        rank_zero_info(f"hybrid: rolled back a predicted segment after {self.machine.segment_pos} steps ({reason})")
        self.machine.enter(Phase.FULL)

    def _segment_failed(self) -> None:
        if self.parts.bandit is not None:
            self.parts.bandit.abort()
        self.machine.segment_failed()
        if self.policy.segment_failed():
            rank_zero_warn(
                f"hybrid: {self.policy.consecutive_failures} predicted segments failed in a row; prediction is off "
                "for the rest of this run, which continues as plain training."
            )

    def accept_segment(self) -> None:
        self.store.release_snapshot()
        self.policy.segment_accepted()
        self.machine.segment_accepted()
        self.record.counters.segments_accepted += 1
