"""Phase-cycle settings of the :class:`~lightning_hybrid.HybridScheduler`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lightning_hybrid.validation import check_bool, check_choice, check_float, check_int

PREDICT_MEMORY = ("none", "offload", "aggressive")
PREDICT_PRECISION = ("32", "bf16")
CAPTURE_BUFFER = ("per_step", "kept")


@dataclass
class HybridConfig:
    """How long each phase lasts and when prediction is allowed.

    Args:
        warmup_steps: ordinary steps at the start of training that only collect statistics.
        full_steps: ordinary steps per cycle during which the predictor learns before a Predict segment.
        max_predict_steps: longest Predict segment (horizon) in optimizer steps.
        confidence_threshold: the predictor's confidence, in ``[0, 1]``, needed to enter Predict.
        predict_forward_every: run a ``no_grad`` forward pass every this many predicted steps to feed the
            divergence monitor; ``0`` never does (the first Correct step still verifies the segment).
        correction_steps: ordinary steps after each Predict segment; the first one verifies the segment.
        max_consecutive_rollbacks: after this many rollbacks in a row prediction is switched off for the run.
        backoff_after: after this many Full cycles in a row end without a segment (low confidence, the bandit's
            "don't predict" arm, an invalid plan), stop capturing updates and feeding the predictor for
            ``full_steps`` steps, then observe one Full cycle again; each further declined cycle backs off for
            twice as long, up to 32 times, until a segment is accepted. ``0`` never backs off.
            Backed off, an ordinary step costs little more than plain training.
        predict_lr_fraction: Predict segments start only while every optimizer group's learning rate is at most
            this fraction of the highest it has reached in this run, in ``(0, 1]``; until then ordinary steps are
            backed off. Predicted updates extrapolate recent ones, which holds only once a decaying learning rate
            has made the steps small (in this project's benchmarks prediction at the full learning rate always
            cost quality); with a constant learning rate a fraction below 1 never predicts. ``1.0`` predicts at
            any learning rate.
        enable_prediction: ``False`` runs the plugin as plain training with its checks and logging, and never
            captures updates.
        predict_memory: what Predict segments free. ``"none"``: nothing. ``"offload"``: gradients are freed and
            the optimizer state moves to (pinned) host memory when a segment starts, and is copied back
            asynchronously when it ends, in time for the next optimizer update. ``"aggressive"``: also keeps the
            rollback snapshot in host memory, releasing the device's update buffer during the segment.
        observe_every: while tracking, capture the update of one ordinary step in this many and teach it to the
            predictor; the others feed only the loss trend. Tracking one update costs a few passes over the
            parameters (the capture's copy and subtraction, the predictor's average and norms), so observing one
            step in ``k`` divides that cost by ``k``; the predictor's average update is then an average over the
            observed steps, and it needs ``k`` times as many steps to see ``min_observations`` updates.
        capture_buffer: when the parameter-sized buffer that captures an ordinary step's update (and holds a
            segment's rollback snapshot) exists. ``"per_step"``: only while a step captures its update and while a
            segment awaits its verdict, so between them ``linear`` holds one parameter copy (its average update);
            the allocation each captured step is reused memory on CUDA (the caching allocator) and measured no
            slower on CPU. ``"kept"``: for the whole run. ``outer`` always keeps it (its anchor).
        predict_precision: ``"32"`` runs Predict forward checks in the Trainer's precision; ``"bf16"`` runs them
            under bf16 autocast whatever the Trainer's precision. Updates are applied in the parameters' dtype.
    """

    warmup_steps: int = 100
    full_steps: int = 20
    max_predict_steps: int = 10
    confidence_threshold: float = 0.5
    predict_forward_every: int = 1
    correction_steps: int = 5
    max_consecutive_rollbacks: int = 5
    backoff_after: int = 3
    predict_lr_fraction: float = 0.4
    enable_prediction: bool = True
    predict_memory: str = "none"
    predict_precision: str = "32"
    observe_every: int = 1
    capture_buffer: str = "per_step"

    def __post_init__(self) -> None:
        owner = "HybridConfig"
        check_int(owner, "warmup_steps", self.warmup_steps)
        check_int(owner, "full_steps", self.full_steps, 1)
        check_int(owner, "max_predict_steps", self.max_predict_steps, 1 if self.enable_prediction else 0)
        check_float(owner, "confidence_threshold", self.confidence_threshold, 0.0, 1.0)
        check_int(owner, "predict_forward_every", self.predict_forward_every)
        check_int(owner, "correction_steps", self.correction_steps, 1)
        check_int(owner, "max_consecutive_rollbacks", self.max_consecutive_rollbacks, 1)
        check_int(owner, "backoff_after", self.backoff_after)
        check_float(owner, "predict_lr_fraction", self.predict_lr_fraction, 0.0, 1.0, open_low=True)
        check_bool(owner, "enable_prediction", self.enable_prediction)
        check_choice(owner, "predict_memory", self.predict_memory, PREDICT_MEMORY)
        check_choice(owner, "predict_precision", self.predict_precision, PREDICT_PRECISION)
        check_int(owner, "observe_every", self.observe_every, 1)
        check_choice(owner, "capture_buffer", self.capture_buffer, CAPTURE_BUFFER)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
