"""The engine's checkpointed state: one flat dictionary, in the layout of ``STATE_VERSION`` 1 (the layout the
scheduler wrote before the engine was split into parts), so checkpoints of either read alike."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.engine.record import Deferred
from lightning_hybrid.phase import Phase
from lightning_hybrid.predictors import Plan


class EngineState:
    """``state_dict``/``load_state_dict`` of :class:`~.engine.HybridEngine`, mixed into it."""

    def state_dict(self) -> dict[str, Any]:
        machine, policy = self.machine, self.policy
        snapshot = self.store.snapshot() if self.store is not None else self._pending_snapshot
        return {
            "phase": int(machine.phase),
            "phase_step": machine.phase_step,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "segment_pos": machine.segment_pos,
            "horizon": machine.horizon,
            "consecutive_rollbacks": policy.consecutive_failures,
            "prediction_off": policy.prediction_off,
            "backoff": [policy.declined, policy.backoffs, policy.backoff_until],
            "lr_ref": list(self.lr_ref),
            "lr_peak": list(policy.lr_peak),
            **self.record.state_dict(),
            "snapshot": snapshot,
            **({"trajectory": self._rule_state()} if self.rule is not None else {}),
            # quiet steps not read yet: the components' states do not hold them; a resumed run learns from them next
            **({"deferred": [d.to_dict() for d in self.deferred]} if self.deferred else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        machine, policy = self.machine, self.policy
        machine.phase = Phase(state["phase"])
        machine.phase_step = int(state["phase_step"])
        self.plan = Plan.from_dict(state["plan"]) if state["plan"] is not None else None
        machine.segment_pos = int(state["segment_pos"])
        machine.horizon = int(state["horizon"])
        policy.consecutive_failures = int(state["consecutive_rollbacks"])
        policy.prediction_off = bool(state["prediction_off"])
        policy.declined, policy.backoffs, policy.backoff_until = (int(v) for v in state["backoff"])
        self.lr_ref = [float(v) for v in state["lr_ref"]]
        policy.lr_peak = [float(v) for v in state["lr_peak"]]
        self.record.load_state_dict(state)
        self.deferred = [Deferred.from_dict(d) for d in state.get("deferred", [])]
        if "trajectory" in state:
            self._load_rule_state(state["trajectory"])
        if self.store is not None and state["snapshot"] is not None:
            self.store.load_snapshot(state["snapshot"])
        elif self.store is not None:
            self.store.release_snapshot()
        else:
            self._pending_snapshot = state["snapshot"]
