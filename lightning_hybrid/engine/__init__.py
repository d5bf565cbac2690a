"""The hybrid training engine as plain objects: the phase machine, the prediction policy, the step guard, the
parameter store and the run record, tied together by :class:`HybridEngine`, which composes one
:class:`PredictionFamily` (``families/``). Nothing here imports Lightning; the ``HybridScheduler`` callback wires
the engine to Lightning's hooks."""

from lightning_hybrid.engine.collectives import TorchCollectives
from lightning_hybrid.engine.components import Bandit, Components, Corrector, Forecaster, Monitor
from lightning_hybrid.engine.deferred import Deferred
from lightning_hybrid.engine.engine import HybridEngine
from lightning_hybrid.engine.families import OuterJumps, PredictSegments, family_of
from lightning_hybrid.engine.family import FAMILIES, EngineView, PredictionFamily, register_family
from lightning_hybrid.engine.guard import Reading, StepGuard
from lightning_hybrid.engine.interface import Collectives, StepHandler
from lightning_hybrid.engine.optimizers import OptimizerSet
from lightning_hybrid.engine.phases import Due, PhaseMachine
from lightning_hybrid.engine.policy import PredictionPolicy
from lightning_hybrid.engine.record import RunRecord, StepRecord
from lightning_hybrid.engine.store import ParameterStore

__all__ = [
    "FAMILIES",
    "Bandit",
    "Collectives",
    "Components",
    "Corrector",
    "Deferred",
    "Due",
    "EngineView",
    "Forecaster",
    "HybridEngine",
    "Monitor",
    "OptimizerSet",
    "OuterJumps",
    "ParameterStore",
    "PhaseMachine",
    "PredictSegments",
    "PredictionFamily",
    "PredictionPolicy",
    "Reading",
    "RunRecord",
    "StepGuard",
    "StepHandler",
    "StepRecord",
    "TorchCollectives",
    "family_of",
    "register_family",
]
