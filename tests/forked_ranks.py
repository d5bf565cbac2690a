"""Ranks started as torchrun starts them, each with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the master's address
in its environment before it builds a Trainer, but forked from one process that has imported what they run, as
Lightning's own ``ddp_fork`` starts its ranks: a fresh interpreter spends about 8 s importing Lightning and the
optional packages torchmetrics loads, more than most two-rank fits of the suite take. Each rank's output goes to
``<logs>/rank<R>.log``, as torchrun's ``--log-dir`` keeps it apart. :func:`forked` starts any calls that way, the
runs that kill themselves too (``tests/faults/kill_worker.py``).

The forking process must be one that only imported (``python -m`` a script of the suite), never the pytest worker,
whose threads could hold a lock across the fork.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tests.helpers import free_port


def forked(calls: list[Callable[[], object]], logs: list[Path], timeout_s: float = 600) -> list[int | None]:
    """Each call in a process of its own, forked from this one and started together, its output to its log; each
    one's exit code once all have ended (negative: the signal that ended it; None: still running at ``timeout_s``,
    then killed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fork = multiprocessing.get_context("fork")
    processes = [fork.Process(target=_logged, args=(call, log)) for call, log in zip(calls, logs, strict=True)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout_s)
    codes = [process.exitcode for process in processes]
    for process in processes:
        if process.exitcode is None:
            process.kill()
    return codes


def run(fit: Callable[[], None], logs: Path, world_size: int = 2, timeout_s: float = 600) -> list[int | None]:
    """Fork ``world_size`` ranks that each call ``fit`` in one process group's rendezvous, each one's output in
    ``logs/rank<R>.log``; their exit codes (:func:`forked`)."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ranks = [partial(_as_rank, fit, r, world_size, port) for r in range(world_size)]
    return forked(ranks, [logs / f"rank{r}.log" for r in range(world_size)], timeout_s)


def _as_rank(fit: Callable[[], None], rank: int, world_size: int, port: int) -> None:
    environment = {"RANK": rank, "LOCAL_RANK": rank, "NODE_RANK": 0, "WORLD_SIZE": world_size, "MASTER_PORT": port}
    os.environ.update({k: str(v) for k, v in environment.items()} | {"MASTER_ADDR": "127.0.0.1"})
    fit()


def _logged(call: Callable[[], object], log_path: Path) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 0
    try:
        call()
    except BaseException:  # the log says what ended the process, its exit code that it did
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
