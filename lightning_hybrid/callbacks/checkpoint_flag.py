"""Whether a checkpoint holds weights no ordinary step has verified yet (a Predict segment, or a jump awaiting its
verdict): flagged in the scheduler's state, under the checkpoint's ``callbacks``, where a load without the plugin (a
plain ``torch.load``, a LightningModule's ``on_load_checkpoint``) finds it with :func:`is_unverified_checkpoint`,
and said once a fit. Nothing is added at the checkpoint's top level: Lightning's own tests compare it whole."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.callbacks.messages import info

UNVERIFIED = "unverified"  # in the scheduler's state: the checkpoint was written inside an unverified prediction
OLD_UNVERIFIED_KEY = "hybrid_unverified_segment"  # where state version 2 kept that flag: at the checkpoint's top level


def is_unverified_checkpoint(checkpoint: dict[str, Any]) -> bool:
    """Whether a loaded checkpoint was written inside an unverified prediction (a Predict segment, or a jump
    awaiting its verdict): a resume judges them where the uninterrupted run would, and may roll them back. Reads
    the scheduler's state (``checkpoint["callbacks"]["HybridScheduler"]["unverified"]``), and the top-level flag of
    state version 2."""
    if OLD_UNVERIFIED_KEY in checkpoint:
        return bool(checkpoint[OLD_UNVERIFIED_KEY])
    states = checkpoint.get("callbacks", {})
    return any(bool(v.get(UNVERIFIED)) for k, v in states.items() if k.split("{")[0] == "HybridScheduler")


def say_unverified(unverified: bool, step: int, said: bool) -> bool:
    """The first time a fit saves unverified weights, say so, as information: it is how the plugin works, not a
    fault, and a user acts on it only to use a checkpoint's weights as they are. Returns whether it has been said."""
    if unverified and not said:
        info(
            f"hybrid: the checkpoint at step {step}, as others of this fit may, holds a prediction awaiting its "
            "verdict (a jump, or a Predict segment). Nothing to do to resume from it: the verdict comes where it "
            "would have. To use a checkpoint's weights as they are (to evaluate or ship them), "
            "lightning_hybrid.is_unverified_checkpoint(checkpoint) tells you whether they were verified. "
            "(Said once a fit.)"
        )
    return said or unverified


def say_resuming(checkpoint: dict[str, Any]) -> None:
    if is_unverified_checkpoint(checkpoint):
        info(
            "hybrid: resuming from a checkpoint whose weights were not yet verified: their verdict comes where it "
            "would have in the uninterrupted run"
        )
