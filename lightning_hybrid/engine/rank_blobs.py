"""A rank's own state in a checkpoint whose non-tensor entries are kept as rank 0 has them (a distributed
checkpoint of FSDP2 shards): each rank writes its state as bytes under a key of its own, ``rank<r>`` (as torchtitan
keeps its ranks' loader states), and reads back its own. The scheduler's and a loop's states both ride so."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

SLOT = "lightning_hybrid"  # the optimizer state's entry that holds the plugin's state


def rank_key(rank: int) -> str:
    return f"rank{rank}"


def to_blob(state: Any, rank: int) -> dict[str, io.BytesIO]:
    """``state`` as this rank's blob, under its key."""
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    return {rank_key(rank): blob}


def from_blob(source: io.BytesIO | Path, where: Any) -> Any:
    """The state a blob (or a file) holds; tensors, numbers, strings and containers only: a tampered blob's pickled
    objects are never run, and are refused naming ``where`` it came from."""
    if isinstance(source, io.BytesIO):
        source.seek(0)
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise RuntimeError(
            f"Refusing to load the hybrid plugin's state from {where}: it holds objects other than tensors and "
            f"plain data, which its state never contains; the checkpoint may have been tampered with "
            f"({str(err).splitlines()[0]})"
        ) from err
