"""Where the plugin's messages during a fit go: Lightning's own channels (``rank_zero_info`` through logging,
``rank_zero_warn`` through warnings), each on a line of its own while a TQDM progress bar is drawn, which would
otherwise carry the message on from the end of its line. Plain module functions, so that whatever holds them
pickles and deep-copies (spawn launchers, notebooks)."""

from __future__ import annotations

from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn


def info(message: str) -> None:
    """``rank_zero_info``, with Lightning's TQDM bars cleared while it writes and drawn again after."""
    with Tqdm.external_write_mode():
        rank_zero_info(message)


def warn(message: str) -> None:
    """``rank_zero_warn``, with Lightning's TQDM bars cleared while it writes and drawn again after."""
    with Tqdm.external_write_mode():
        rank_zero_warn(message)
