"""Phase-cycle settings of the :class:`~lightning_hybrid.HybridScheduler`."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_hybrid.settings import (
    CYCLES,
    EVERY_MODE,
    PER_STEP,
    Bool,
    Choice,
    Float,
    Int,
    Settings,
    check_int,
    setting,
)


@dataclass
class HybridConfig(Settings):
    """How long each phase lasts and when prediction is allowed; ``docs/settings.md`` tells each setting."""

    warmup_steps: int = setting(100, "ordinary steps before the first cycle", Int(0), reads=EVERY_MODE)
    full_steps: int = setting(
        20,
        "ordinary steps per cycle: between jumps (K), before a Predict segment is considered",
        Int(1),
        reads=CYCLES,
    )
    max_predict_steps: int = setting(
        10, "longest Predict segment, in optimizer steps (≥ 1 with prediction enabled)", Int(0), reads=PER_STEP
    )
    confidence_threshold: float = setting(
        0.5, "the predictor's confidence needed to enter Predict", Float(0.0, 1.0), reads=PER_STEP
    )
    predict_forward_every: int = setting(
        1,
        "a `no_grad` forward check every this many predicted steps, feeding the divergence monitor; 0: never (the "
        "first Correct step still verifies the segment)",
        Int(0),
        reads=PER_STEP,
    )
    correction_steps: int = setting(
        5, "ordinary steps after each segment; the first verifies it", Int(1), reads=PER_STEP
    )
    max_consecutive_rollbacks: int = setting(
        5,
        "failed predictions in a row (rolled-back segments, invalid plans, rejected jumps) before prediction is "
        "switched off for the run",
        Int(1),
        reads=CYCLES,
    )
    backoff_after: int = setting(
        3,
        "Full cycles in a row without a segment before the plugin stops capturing updates and training the "
        "predictor for `full_steps` steps; after a pause one declined cycle starts the next, twice as long (up to "
        "32 times), until a segment is accepted; 0: never. Backed off, a step costs little more than plain training",
        Int(0),
        reads=PER_STEP,
    )
    predict_lr_fraction: float = setting(
        0.4,
        "start Predict segments only while every optimizer group's learning rate is at most this fraction of the "
        "highest it has reached in the run; until then ordinary steps are backed off. Predicted updates "
        "extrapolate recent ones, which holds only once a decaying learning rate has made the steps small (at "
        "the full rate prediction always cost quality in the benchmarks); with a constant learning rate a fraction "
        "below 1 never predicts, 1.0 predicts at any rate",
        Float(0.0, 1.0, open_low=True),
        reads=PER_STEP,
    )
    enable_prediction: bool = setting(
        True,
        "`False` runs the plugin as plain training with its checks and logging, never capturing updates (no jump, "
        "no average, no segment)",
        Bool(),
        reads=EVERY_MODE,
    )
    predict_memory: str = setting(
        "none",
        "what Predict segments free: `none`; `offload` (gradients freed, optimizer state to pinned host memory, "
        "copied back asynchronously before the next update); `aggressive` (also the rollback snapshot on the "
        "host). See [Memory](how-it-works.md#memory)",
        Choice(("none", "offload", "aggressive")),
        reads=PER_STEP,
    )
    predict_precision: str = setting(
        "32",
        "`bf16` runs Predict forward checks under bf16 autocast whatever the Trainer's precision; updates stay in "
        "the parameters' dtype",
        Choice(("32", "bf16")),
        reads=PER_STEP,
    )
    observe_every: int = setting(
        1,
        "while tracking, capture and learn from one ordinary step's update in this many; the others feed only the "
        "loss trend. Divides the tracking cost (a few passes over the parameters per observed step) by this; the "
        "predictor needs this many times more steps to be ready",
        Int(1),
        reads=PER_STEP,
    )
    capture_buffer: str = setting(
        "per_step",
        "when the parameter-sized buffer that captures an update (and holds a segment's rollback snapshot) exists: "
        "`per_step` only while a step captures its update or a segment awaits its verdict, so between steps "
        "outside Predict `linear` holds one parameter copy (its average update); `kept` for the whole run. Runs "
        "are bitwise the same either way. `outer` always keeps it (its anchor). See "
        "[Memory](how-it-works.md#memory)",
        Choice(("per_step", "kept")),
        reads=PER_STEP,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.enable_prediction:  # a segment of no step is no segment
            check_int("HybridConfig", "max_predict_steps", self.max_predict_steps, 1)
