"""Whether a checkpoint saved now resumes with the batches the uninterrupted run would have drawn: the plugin's own
state always resumes exactly, but the run as a whole does only where the training loader can take up where it
was. Lightning saves a loader's place only if the loader has ``state_dict``/``load_state_dict``, and even then a
loader whose sampler Lightning wrapped for several ranks (``DistributedSamplerWrapper``) draws the epoch's order
anew from the process's random state, which no checkpoint holds: its saved place points into another order."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.callbacks.messages import warn
from lightning_hybrid.lightning_packages import classes, module

EXACT_LOADERS = (
    "torchdata's StatefulDataLoader (shuffled or not; on several ranks the plugin's strategies give it one sharded "
    "permutation; with a sampler of your own, a distributed one that saves its place and "
    "Trainer(use_distributed_sampler=False)), or checkpoints at epoch ends"
)


def mid_epoch(trainer: Any) -> bool:
    """Whether the fit is inside an epoch: some of its batches ran, not all of them."""
    ran = trainer.fit_loop.epoch_loop.batch_progress.current.processed
    return 0 < ran < trainer.num_training_batches  # an iterable loader of unknown length: always inside


def why_not_resumable(loader: Any) -> str | None:
    """Why ``loader`` cannot resume mid-epoch with the batches it would have handed out, or ``None`` if it can."""
    name = type(loader).__name__
    if not isinstance(loader, module("fabric.utilities.types")._Stateful):
        return f"the training loader ({name}) has no state_dict/load_state_dict, so a resume starts its epoch over"
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    if any(isinstance(s, classes("fabric.utilities.distributed", "DistributedSamplerWrapper")) for s in samplers):
        return (
            "Lightning wrapped the training loader's own sampler in a DistributedSamplerWrapper for the ranks, "
            f"which draws each epoch's order anew from this process's random state: the {name}'s saved place "
            "points into another order on resume"
        )
    return None


def unresumable_checkpoint(trainer: Any) -> str | None:
    """What to tell a user whose checkpoint, saved now, will not resume with the uninterrupted run's batches. Not
    of the checkpoint Lightning saves as ``max_steps`` ends the fit: resuming it trains only if the user asks for more
    steps, and then Lightning says, as that fit starts, that its loader cannot take up where it was."""
    if trainer.state.fn != "fit" or not mid_epoch(trainer) or trainer.global_step == trainer.max_steps:
        return None
    combined = module("pytorch.utilities.combined_loader").CombinedLoader
    loaders = combined(trainer.train_dataloader).flattened if trainer.train_dataloader is not None else []
    reason = next((r for r in map(why_not_resumable, loaders) if r is not None), None)
    if reason is None:
        return None
    return (
        f"hybrid: the checkpoint saved at step {trainer.global_step} falls inside an epoch, and {reason}. A run "
        "resumed from it trains on other batches than the uninterrupted run would (the plugin's own state resumes "
        f"exactly). For an exact resume use {EXACT_LOADERS}."
    )


def say_unresumable(trainer: Any, said: bool) -> bool:
    """The first time a fit saves a checkpoint its loader cannot resume exactly, say so. Returns whether it has."""
    message = None if said else unresumable_checkpoint(trainer)
    if message is not None:
        warn(message)
    return said or message is not None
