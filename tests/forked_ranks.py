"""Ranks started as torchrun starts them, each with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the master's address
in its environment before it builds a Trainer, but forked from one process that has imported what they run, as
Lightning's own ``ddp_fork`` starts its ranks: a fresh interpreter spends about 8 s importing Lightning and the
optional packages torchmetrics loads, more than most two-rank fits of the suite take. Each rank's output goes to
``<logs>/rank<R>.log``, as torchrun's ``--log-dir`` keeps it apart.

The forking process must be one that only imported (``python -m`` a script of the suite), never the pytest worker,
whose threads could hold a lock across the fork.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.helpers import free_port


def run(fit: Callable[[], None], logs: Path, world_size: int = 2, timeout_s: float = 600) -> list[int | None]:
    """Fork ``world_size`` ranks that each call ``fit`` in one process group's rendezvous; each one's exit code once
    all have ended (negative: the signal that ended it; None: still running at ``timeout_s``, then killed)."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=_rank, args=(fit, r, world_size, port, logs)) for r in range(world_size)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout_s)
    codes = [rank.exitcode for rank in ranks]
    for rank in ranks:
        if rank.exitcode is None:
            rank.kill()
    return codes


def _rank(fit: Callable[[], None], rank: int, world_size: int, port: int, logs: Path) -> None:
    environment = {"RANK": rank, "LOCAL_RANK": rank, "NODE_RANK": 0, "WORLD_SIZE": world_size}
    os.environ.update(
        {k: str(v) for k, v in environment.items()} | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    log = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 0
    try:
        fit()
    except BaseException:  # the log says what ended the rank, its exit code that it did
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: a gloo thread still joinable there at times aborts the process ("terminate
    # called without an active exception") even after the group was destroyed.
    os._exit(code)


def tail(logs: Path, world_size: int = 2, chars: int = 3000) -> str:
    """The end of each rank's log, for an assertion's message."""
    return "\n".join(f"rank {r}: ...{(logs / f'rank{r}.log').read_text()[-chars:]}" for r in range(world_size))
