"""Where the plugin's messages during a fit go: Lightning's own channels (``rank_zero_info`` through logging,
``rank_zero_warn`` through warnings, shared by both Lightning packages), each on a line of its own while a TQDM
progress bar is drawn, which would otherwise carry the message on from the end of its line. Plain module functions,
so that whatever holds them pickles and deep-copies (spawn launchers, notebooks)."""

from __future__ import annotations

from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn
from tqdm import tqdm


def info(message: str) -> None:
    """``rank_zero_info``, with the TQDM bars (Lightning's, of either package) cleared while it writes."""
    with tqdm.external_write_mode():
        rank_zero_info(message)


def warn(message: str) -> None:
    """``rank_zero_warn``, with the TQDM bars (Lightning's, of either package) cleared while it writes."""
    with tqdm.external_write_mode():
        rank_zero_warn(message)
