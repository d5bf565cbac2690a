"""The "Phase curves" custom-scalars layout: TensorBoard's Custom Scalars tab groups the ``hybrid/*`` curves that
belong together, so the actual and predicted loss share one chart and the predicted loss shows its band.

A multiline chart's tags are regular expressions, so each is anchored: ``hybrid/loss`` alone would also draw the
predicted loss and both band edges. A margin chart's tags are exact names."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_hybrid.phase import Phase

PHASE_CURVES = {
    "Phase curves": {
        "loss: actual vs predicted": ["Multiline", ["^hybrid/loss$", "^hybrid/loss_predicted$"]],
        "predicted loss and its band": [
            "Margin",
            ["hybrid/loss_predicted", "hybrid/loss_predicted_lower", "hybrid/loss_predicted_upper"],
        ],
        "phase (" + ", ".join(f"{int(p)} {p.label}" for p in Phase) + ")": ["Multiline", ["^hybrid/phase$"]],
        "confidence": ["Multiline", ["^hybrid/confidence$"]],
        "horizon": ["Multiline", ["^hybrid/horizon$"]],
        "rollbacks": ["Multiline", ["^hybrid/rollbacks$"]],
        "backward skipped %": ["Multiline", ["^hybrid/backward_skipped_pct$"]],
    }
}


def write_phase_curves_layout(trainer: pl.Trainer) -> None:
    """Add the layout to every TensorBoard logger of ``trainer`` (on global rank 0, where they write)."""
    if trainer.global_rank != 0:
        return
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_custom_scalars(PHASE_CURVES)
