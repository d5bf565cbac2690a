"""Where the plugin's messages during a fit go: Lightning's own channels (``rank_zero_info`` through logging,
``rank_zero_warn`` through warnings), each on a line of its own while a TQDM progress bar is drawn, which would
otherwise carry the message on from the end of its line."""

from __future__ import annotations

from collections.abc import Callable

from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn


def beside_bars(say: Callable[[str], object]) -> Callable[[str], None]:
    """``say``, with Lightning's TQDM bars cleared while it writes and drawn again after (tqdm's
    ``external_write_mode``, for the bars of Lightning's own ``Tqdm`` class; with none drawn, ``say`` alone)."""

    def said(message: str) -> None:
        with Tqdm.external_write_mode():
            say(message)

    return said


info, warn = beside_bars(rank_zero_info), beside_bars(rank_zero_warn)
