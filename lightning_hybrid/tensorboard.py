"""The Custom Scalars layouts: TensorBoard's Custom Scalars tab groups the ``hybrid/*`` curves that belong together,
one layout per mode, each chart drawn from tags that mode writes.

A multiline chart's tags are regular expressions, so each is anchored: ``hybrid/loss`` alone would also draw the
predicted loss and both band edges. A margin chart's tags are exact names."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.lightning_packages import classes
from lightning_hybrid.phase import Phase


def _lines(*tags: str) -> list:
    return ["Multiline", [f"^hybrid/{tag}$" for tag in tags]]


def _phase_chart(phases: tuple[Phase, ...]) -> str:
    return "phase (" + ", ".join(f"{int(p)} {p.label}" for p in phases) + ")"


LAYOUTS = {
    "jumps": {
        "Outer jumps": {
            "training loss": _lines("loss"),
            "jumps made, kept and undone (running counts)": _lines("jumps_made", "jumps_kept", "jumps_undone"),
            "cycles without a jump: momentum restarted, too noisy to judge": _lines(
                "momentum_restarts", "blind_cycles"
            ),
            "the last verdict: window mean loss before and after the jump": _lines("verdict_before", "verdict_after"),
            "the last verdict's margin (after may exceed before by this)": _lines("verdict_margin"),
            "the last jump's size relative to the weights": _lines("jump_size"),
            "the cycle's verdict margin / loss, against verify_resolution (above: no jump)": _lines(
                "cycle_margin", "verify_resolution"
            ),
            _phase_chart((Phase.WARMUP, Phase.FULL)): _lines("phase"),
        }
    },
    "averaging": {
        "Primal averaging": {
            "training loss": _lines("loss"),
            "steps averaged (running count)": _lines("averaged_steps"),
            "the training weights' distance from their average, relative": _lines("average_gap"),
            _phase_chart((Phase.WARMUP, Phase.FULL)): _lines("phase"),
        }
    },
    "per-step": {
        "Phase curves": {
            "loss: actual vs predicted": _lines("loss", "loss_predicted"),
            "predicted loss and its band": [
                "Margin",
                ["hybrid/loss_predicted", "hybrid/loss_predicted_lower", "hybrid/loss_predicted_upper"],
            ],
            _phase_chart(tuple(Phase)): _lines("phase"),
            "confidence": _lines("confidence"),
            "horizon": _lines("horizon"),
            "rollbacks": _lines("rollbacks"),
            "backward skipped %": _lines("backward_skipped_pct"),
        }
    },
}


def write_layout(trainer: Any, mode: str) -> None:
    """Add ``mode``'s layout to every TensorBoard logger of ``trainer`` (on global rank 0, where they write)."""
    if trainer.global_rank != 0 or mode not in LAYOUTS:
        return
    for logger in trainer.loggers:
        if isinstance(logger, classes("pytorch.loggers", "TensorBoardLogger")):
            logger.experiment.add_custom_scalars(LAYOUTS[mode])
