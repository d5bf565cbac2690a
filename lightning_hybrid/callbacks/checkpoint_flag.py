"""Whether a checkpoint holds weights no ordinary step has verified yet (a Predict segment, or a jump awaiting its
verdict): flagged in the scheduler's state and at the checkpoint's top level, where a load without the plugin (a
plain ``torch.load``, a LightningModule's ``on_load_checkpoint``) finds it, and said once a fit."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info

UNVERIFIED = "unverified"  # in the scheduler's state: the checkpoint was written inside an unverified prediction
CHECKPOINT_FLAG = "hybrid_unverified"  # the same, at the checkpoint's top level
OLD_UNVERIFIED_KEY = "hybrid_unverified_segment"  # where state version 2 kept that flag: at the checkpoint's top level


def is_unverified_checkpoint(checkpoint: dict[str, Any]) -> bool:
    """Whether a loaded checkpoint was written inside an unverified prediction (a Predict segment, or a jump
    awaiting its verdict): it resumes exactly, but its model weights may yet be rolled back. Reads the top-level
    flag (``checkpoint["hybrid_unverified"]``), and the scheduler's state of checkpoints written before it."""
    for key in (CHECKPOINT_FLAG, OLD_UNVERIFIED_KEY):
        if key in checkpoint:
            return bool(checkpoint[key])
    states = checkpoint.get("callbacks", {})
    return any(bool(v.get(UNVERIFIED)) for k, v in states.items() if k.split("{")[0] == "HybridScheduler")


def flag_checkpoint(checkpoint: dict[str, Any], unverified: bool, step: int, said: bool) -> bool:
    """Set the top-level flag; the first time a fit saves unverified weights, say so. Returns whether it was said."""
    checkpoint[CHECKPOINT_FLAG] = unverified
    if unverified and not said:
        rank_zero_info(
            f"hybrid: the checkpoint saved at step {step} holds weights not yet verified (a jump awaiting its "
            "verdict, or a Predict segment): it resumes exactly, but a rollback may yet undo them; "
            f"`checkpoint['{CHECKPOINT_FLAG}']` (and lightning_hybrid.is_unverified_checkpoint) says which do"
        )
    return said or unverified


def say_resuming(checkpoint: dict[str, Any]) -> None:
    if is_unverified_checkpoint(checkpoint):
        rank_zero_info(
            "hybrid: resuming from a checkpoint whose weights were not yet verified: their verdict comes where it "
            "would have in the uninterrupted run"
        )
