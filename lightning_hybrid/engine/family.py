"""The contract of a prediction family: one way of moving the weights beyond what the optimizer's steps do, judged
and undone when it loses. The engine runs the steps, reads and guards them and moves the phase machine; a family
decides what prediction does around them. Built-in families: ``outer`` jumps (``families/jumps.py``) and per-step
Predict segments (``families/segments.py``).

A predictor object names its family (its ``family`` attribute); :func:`register_family` makes a new one known. A
family is built by the engine with an :class:`EngineView`, the part of the engine it may use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from torch import Tensor

from lightning_hybrid.algorithms import DivergenceCheck
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine.components import Components
from lightning_hybrid.engine.guard import StepGuard
from lightning_hybrid.engine.interface import Collectives
from lightning_hybrid.engine.phases import Due, PhaseMachine
from lightning_hybrid.engine.policy import PredictionPolicy
from lightning_hybrid.engine.record import RunRecord, StepRecord
from lightning_hybrid.engine.store import ParameterStore
from lightning_hybrid.phase import Phase
from lightning_hybrid.settings import EVERY_MODE, read_by, setting_names, setting_values


class EngineView(Protocol):
    """What a family may use of the engine that runs it: the run's parts, the current step, and two services."""

    config: HybridConfig
    machine: PhaseMachine
    policy: PredictionPolicy
    record: RunRecord
    parts: Components
    store: ParameterStore
    collectives: Collectives
    step_guard: StepGuard
    step: StepRecord  # the step running now
    automatic: bool  # Lightning's automatic optimization
    global_step: int
    last_step: int | None  # where training will end, where known
    world_size: int

    def info(self, message: str) -> None:
        """Report to the user (rank zero only under Lightning)."""

    def count_failure(self) -> None:
        """A prediction was undone: count it towards ``max_consecutive_rollbacks`` (and say when that turns
        prediction off)."""


class PredictionFamily:
    """One way of predicting, as the engine calls it. Every method has a do-nothing default, so a family overrides
    only what it does; the order of the calls in one optimizer step is:

    1. :meth:`begin_step` (the step's phase is set; a family may move the weights here, before the forward);
    2. ordinary steps: :meth:`judge` (loss and gradient norm read, before the update); predicted steps:
       :meth:`predicted_training_step` and :meth:`predict_step` instead;
    3. :meth:`learn` (or, for a quiet step, :meth:`track` now and :meth:`learn` later);
    4. when the phase machine needs a decision: :meth:`cycle_end` (a Full cycle is complete: the verdict on
       what was predicted, and whether to predict next) or :meth:`phase_done`.

    Between steps: :meth:`end_fit`.
    State: :meth:`state_dict`/:meth:`load_state_dict` (Python values and host tensors, checkpointed by the engine).
    """

    name: ClassVar[str]
    mode: ClassVar[str]  # what the user reads: the summary's ``mode``, the TensorBoard layout's key
    keeps_buffer: ClassVar[bool] = False  # hold the store's parameter-sized buffer for the whole run
    gated: ClassVar[bool] = True  # observation waits for the learning-rate gate (``predict_lr_fraction``)
    chooses_horizons: ClassVar[bool] = False  # a HorizonBandit has something to choose
    predicts_steps: ClassVar[bool] = False  # enters Predict: steps without a backward pass
    uses_corrector: ClassVar[bool] = False  # reads the ResidualCorrector (and the state encoder it works on)
    phases: ClassVar[tuple[Phase, ...]] = tuple(Phase)  # the phases its steps can be in
    failures: ClassVar[tuple[str, str]] = ("predictions failed", "prediction is")  # the warning when it turns off
    # the settings it reads, of HybridConfig and of the DivergenceMonitor: any other is ignored, with a warning. A
    # built-in family's are those whose declarations name it; a family of one's own reads them all
    phase_settings: ClassVar[tuple[str, ...]] = tuple(setting_names(HybridConfig))
    monitor_settings: ClassVar[tuple[str, ...]] = tuple(setting_names(DivergenceCheck))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls) and "mode" not in vars(cls):
            cls.mode = cls.name  # a family of one's own is its own mode
        if vars(cls).get("name") in EVERY_MODE:
            cls.phase_settings = read_by(HybridConfig, cls.name)
            cls.monitor_settings = read_by(DivergenceCheck, cls.name)

    def __init__(self, engine: EngineView) -> None:
        self.engine = engine

    @classmethod
    def check(cls, config: HybridConfig, parts: Components, sharded: bool) -> None:
        """Refuse, with a ``ValueError`` naming the setting, what this family cannot run with (``sharded``: each
        rank holds only shards of the parameters)."""
        name = parts.predictor.name
        if parts.bandit is not None and not cls.chooses_horizons:
            raise ValueError(
                f"predictor={name!r} makes no Predict segments, so the HorizonBandit has nothing to choose: remove "
                "it (`hybrid_callbacks(predictor=..., bandit=False)`, the default for such predictors)."
            )
        if config.predict_memory != "none" and sharded:
            raise ValueError(
                f"predict_memory={config.predict_memory!r} is not supported with a sharded strategy (hybrid_fsdp): "
                "its optimizer state is already sharded; use predict_memory='none'."
            )
        if config.predict_memory != "none" and not cls.predicts_steps:
            raise ValueError(
                f"predict_memory={config.predict_memory!r} frees memory during Predict segments, which "
                f"predictor={name!r} does not run; use predict_memory='none'."
            )

    @classmethod
    def first_judged_step(cls, config: HybridConfig, predictor: Any) -> int:
        """The earliest global step by which this family can have made a prediction and judged it: a fit that ends
        before it trains as plain Lightning (the scheduler warns)."""
        return config.warmup_steps + config.full_steps

    def setup(self, restored: bool) -> None:
        """The store was (re)built on the trainable tensors: set up on them. ``restored``: a checkpoint's state was
        loaded since, and the run continues from it; otherwise the family starts afresh."""

    # -- one step ------------------------------------------------------------------------------------------------
    def begin_step(self, step: StepRecord) -> bool:
        """A step starts in ``step.phase``; setting ``step.capture`` asks the engine to capture its update into the
        store's buffer (``new - old``; ``step.delta_ready`` once done). Returns whether the step may be quiet: nothing
        to verify, and what there is to learn from it can wait (guarded on the device, read later with others)."""
        return False

    def judge(self, loss: float) -> bool:
        """An ordinary step's loss, read before its update (``nan`` if non-finite): the verdict on anything still
        unverified. Returns whether the step's update must be skipped (its gradient was taken at rejected
        weights)."""
        return False

    def track(self, step: StepRecord) -> Tensor | None:
        """A quiet step has ended: fold what must be taken now into device tensors (returned, read later)."""
        return None

    def skip_tracked(self, tracked: Any) -> None:
        """A quiet step's tracked values belong to an update the optimizer skipped on the device."""

    def learn(self, step: StepRecord, global_step: int, lrs: list[float], seconds: float, tracked: Any) -> float:
        """Learn from a finished step, in step order; returns the loss the family expected for it (``nan``)."""
        return float("nan")

    def cycle_end(self) -> None:
        """A Full cycle is complete (and the trainable set unchanged): judge and decide."""

    def phase_done(self, due: Due) -> None:
        """A Predict segment applied its last update, or the Correct steps after it are done."""

    @property
    def horizon(self) -> int:
        """The length of the running Predict segment, for the phase machine."""
        return 0

    # -- predicted steps (families that enter Predict) -----------------------------------------------------------
    def predicted_training_step(self, run: Callable[[], Any]) -> Any:
        """``training_step`` on a predicted step; ``run`` calls the module's own."""
        raise RuntimeError(f"the {self.name!r} family makes no predicted steps")

    def predict_step(self, closure: Callable[[], Any]) -> Any:
        raise RuntimeError(f"the {self.name!r} family makes no predicted steps")

    # -- between steps -------------------------------------------------------------------------------------------
    @property
    def unverified(self) -> bool:
        """Whether the weights now hold a prediction that no verdict has kept yet."""
        return False

    evaluating = False  # the parameters hold what the run is evaluated at, put in by :meth:`evaluate`

    def evaluate(self, on: bool) -> bool:
        """Put in the parameters what the run is evaluated at (``on``: validation), or take it back out; returns
        whether they changed. Most families evaluate the weights they train."""
        return False

    def evaluated_weights(self) -> list[Tensor] | None:
        """What a checkpoint written now must hold in place of the parameters (the store's tensors, in its order),
        where the parameters do not hold it; ``None``: the parameters as they are."""
        return None

    def end_fit(self) -> None:
        """Training ends, however it ends: undo anything unverified; leave the weights ``fit`` hands back."""

    # -- reporting and state -------------------------------------------------------------------------------------
    def metrics(self, step: StepRecord, predicted_loss: float) -> dict[str, float]:
        """The family's ``hybrid/*`` scalars of the step just ended (charted by its TensorBoard layout), given the
        loss it expected for the step (``nan`` where none). Each is logged at every logging step, ``nan`` where it
        has no value: Lightning would log a value it was given earlier again."""
        return {}

    def progress(self) -> dict[str, float]:
        """What the progress bar shows of the run so far, as numbers (logged for it at each decision)."""
        return {}

    def summary(self) -> dict[str, Any]:
        """The family's counters in ``hybrid_summary.json``, in its own words."""
        return {}

    def settings(self) -> dict[str, Any]:
        """Every setting this mode reads, with the value it runs with: the phase settings, the predictor's (or
        rule's), the monitor's and, where the mode uses them, the corrector's and the bandit's."""
        e, parts = self.engine, self.engine.parts
        out = {name: getattr(e.config, name) for name in self.phase_settings}
        out.update(setting_values(parts.predictor))
        out.update({n: getattr(parts.monitor, n) for n in self.monitor_settings if hasattr(parts.monitor, n)})
        for part in (parts.corrector if self.uses_corrector else None, parts.bandit):
            if part is not None:
                out.update(setting_values(part))
        return out

    def report(self, summary: dict[str, Any]) -> list[str]:
        """The end-of-fit lines about what the family did, from its :meth:`summary`."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @staticmethod
    def migrate_v1(state: dict[str, Any]) -> dict[str, Any]:
        """This family's part of a checkpoint of state version 1, when the engine's state was one flat dictionary;
        a family added since has none."""
        raise ValueError("it was written before this prediction family existed")


FAMILIES: dict[str, type[PredictionFamily]] = {}


def register_family(family: type[PredictionFamily]) -> type[PredictionFamily]:
    """Make ``family`` known by its ``name`` (usable as a class decorator); a predictor whose ``family`` attribute
    is that name is run by it."""
    FAMILIES[family.name] = family
    return family
