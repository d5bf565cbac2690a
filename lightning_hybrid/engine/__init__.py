"""The hybrid training engine as plain objects: the phase machine, the prediction policy, the step guard, the
parameter store and the run record, tied together by :class:`HybridEngine`. Nothing here needs a Trainer; the
``HybridScheduler`` callback wires the engine to Lightning's hooks."""

from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.engine import HybridEngine
from lightning_hybrid.engine.guard import Reading, StepGuard
from lightning_hybrid.engine.interface import Collectives, LocalCollectives, StepHandler
from lightning_hybrid.engine.phases import Due, PhaseMachine
from lightning_hybrid.engine.policy import PredictionPolicy
from lightning_hybrid.engine.record import RunRecord, StepRecord
from lightning_hybrid.engine.store import ParameterStore

__all__ = [
    "Collectives",
    "Components",
    "Due",
    "HybridEngine",
    "LocalCollectives",
    "ParameterStore",
    "PhaseMachine",
    "PredictionPolicy",
    "Reading",
    "RunRecord",
    "StepGuard",
    "StepHandler",
    "StepRecord",
]
