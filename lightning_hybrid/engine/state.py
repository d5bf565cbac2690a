"""The engine's checkpointed state, one part per owner, and the migration from the layout before it.

Since version 2: ``{"machine", "policy", "record", "deferred", "family": {"name", ...}}``, each part written by its
owner; ``"family"`` is ``None`` for an engine no ``fit`` has connected yet (a checkpoint saved before ``fit``, or
after ``validate``), whose state is a fresh run's. Version 1 was one flat dictionary (the layout the scheduler wrote
before the engine was split into parts, kept by the engine of mixins, with keys added later read with defaults);
:func:`migrate_v1` turns it into version 2, moving what outer's jumps counted as segments to the jump counters.
"""

from __future__ import annotations

from typing import Any

from lightning_hybrid.engine.deferred import Deferred

JUMP_COUNTERS = {"segments_started": "jumps_made", "segments_accepted": "jumps_kept"}


def engine_state(engine: Any) -> dict[str, Any]:
    return {
        "machine": engine.machine.state_dict(),
        "policy": engine.policy.state_dict(),
        "record": engine.record.state_dict(),
        # quiet steps not read yet: the components' states do not hold them; a resumed run learns from them next
        "deferred": [d.to_dict() for d in engine.deferred],
        "family": None if engine.family is None else {"name": engine.family.name, **engine.family.state_dict()},
    }


def load_engine_state(engine: Any, state: dict[str, Any]) -> bool:
    """Restore ``state``; returns whether it held a family's run (one written before any ``fit`` did not)."""
    family = state["family"]
    if family is not None and engine.family is not None and family["name"] != engine.family.name:
        raise ValueError(
            f"HybridScheduler: the checkpoint was written by a run of the {family['name']!r} prediction family, but "
            f"this run's predictor is run by {engine.family.name!r}; resume it with the predictor that wrote it"
        )
    engine.machine.load_state_dict(state["machine"])
    engine.policy.load_state_dict(state["policy"])
    engine.record.load_state_dict(state["record"])
    engine.deferred = [Deferred.from_dict(d) for d in state["deferred"]]
    if family is not None and engine.family is not None:
        engine.family.load_state_dict(family)
    return family is not None


def migrate_v1(state: dict[str, Any], family: Any) -> dict[str, Any]:
    """A version 1 state in the version 2 layout, for the run's ``family`` (version 1 did not name it)."""
    try:
        family_state = family.migrate_v1(state)
    except ValueError as err:
        raise ValueError(f"HybridScheduler: the checkpoint cannot resume this {family.name!r} run: {err}") from err
    counters = dict(state["counters"])
    if "trajectory" in state:  # outer's jumps were counted as segments, each rejection as one predicted step
        for old, new in JUMP_COUNTERS.items():
            counters[new] = counters.pop(old, 0)
        counters["jumps_rejected"] = counters.pop("predicted_steps_rolled_back", 0)
    return {
        "machine": {k: state[k] for k in ("phase", "phase_step", "segment_pos", "horizon")},
        "policy": {
            "consecutive_failures": state["consecutive_rollbacks"],
            "prediction_off": state["prediction_off"],
            "backoff": state["backoff"],
            "lr_peak": state["lr_peak"],
        },
        "record": {"counters": counters, "errors": state["errors"], "wall_time_s": state["wall_time_s"]},
        "deferred": state.get("deferred", []),
        "family": {"name": family.name, **family_state},
    }
