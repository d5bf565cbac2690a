"""The plugin's state on a sharded run (FSDP2). Each rank holds its own shards of the rule's tensors, but a
distributed checkpoint keeps the callbacks' states as rank 0 has them. So the hybrid callbacks' states ride, per
rank, inside the distributed checkpoint itself: one blob each rank writes under the first optimizer's entry
(``optimizer_0.lightning_hybrid.rank<r>``, as torchtitan keeps its ranks' loader states) and reads back on resume,
while rank 0's copy among the callbacks is a marker. Lightning's own loading reads only the module's and the
optimizers' keys, so the blobs are the plugin's alone. Checkpoints ``hybrid_fsdp`` wrote before 2026-12-07 kept
them in a file per rank beside the shards, read as they are."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning_hybrid.engine.rank_blobs import SLOT, from_blob, rank_key, to_blob

PER_RANK = "per_rank"  # rank 0's marker among the callbacks: the state is this rank's blob
OLD_FILE = "hybrid_callbacks_rank{rank}.pt"  # where hybrid_fsdp kept them before


def stow(checkpoint: dict[str, Any], keys: Iterable[str], rank: int, kept: Iterable[str] = ()) -> None:
    """From ``on_save_checkpoint``: move the states of the callbacks ``keys`` into this rank's blob, leaving a marker
    that keeps the entries named in ``kept`` (flags a reader of rank 0's copy may look for). A checkpoint without
    optimizer states (none to step) keeps them where they are."""
    states, optimizers = checkpoint.get("callbacks"), checkpoint.get("optimizer_states")
    if not states or not optimizers:
        return
    mine = {key: states[key] for key in keys if key in states}
    optimizers[0][SLOT] = to_blob(mine, rank)
    for key, state in mine.items():
        states[key] = {PER_RANK: True, **{name: state[name] for name in kept if name in state}}


def unstow(checkpoint: dict[str, Any], path: Any, rank: int) -> None:
    """From ``on_load_checkpoint``: put this rank's states back among the checkpoint's callbacks, from the
    distributed checkpoint at ``path`` (or the file per rank of an earlier one), before Lightning loads them."""
    states = checkpoint.get("callbacks")
    folder = Path(path) if path is not None else None
    if not states or folder is None or not folder.is_dir():
        return
    old = folder / OLD_FILE.format(rank=rank)
    if old.is_file():
        states.update(from_blob(old, old))
    elif any(isinstance(state, dict) and state.get(PER_RANK) for state in states.values()):
        states.update(from_blob(_blob(folder, rank), folder))


def _blob(folder: Path, rank: int) -> io.BytesIO:
    from torch.distributed.checkpoint import FileSystemReader, load

    key = rank_key(rank)
    if f"optimizer_0.{SLOT}.{key}" not in FileSystemReader(folder).read_metadata().state_dict_metadata:
        raise RuntimeError(
            f"Cannot resume the hybrid callbacks of rank {rank} from {folder}: it holds no state of that rank. Their "
            "state is per shard, so resume with the world size the checkpoint was saved with."
        )
    slot = {"optimizer_0": {SLOT: {key: io.BytesIO()}}}
    load(slot, checkpoint_id=folder, no_dist=True)
    return slot["optimizer_0"][SLOT][key]
