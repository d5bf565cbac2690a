"""How long what a user runs takes: a command timed as a user runs it (wall time, and the CPU time of every process
it starts), kept in ``benchmarks/results/footprint/times.json``; the README and the footprint's table quote it
through ``python -m benchmarks.record``.

    python -m benchmarks.footprint quick_start -- lightning-hybrid-train mode=compare
    python -m benchmarks.footprint suite -- sh -c 'pip install torch==2.13.0 -e ".[test]" && pytest'  # fresh clone
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, now, write_atomic

TIMES = RESULTS / "footprint" / "times.json"
WHAT = {  # the name of each timed command, as the table says it
    "quick_start": "the Quick start's job, `mode=compare` on the char GPT (plain, then the default)",
    "optuna": "the Optuna search, `hparams_search=hybrid_optuna` (20 trials of the char GPT, one after another)",
    "suite": "the README's test command on a fresh clone (the install, then every test on both cores)",
}


PYTEST_LINE = re.compile(r"=+ .*\d+ passed.* in (\d+\.\d+)s")  # pytest's closing line: how long the tests alone took


def timed(command: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """Runs ``command`` and returns its exit code, wall seconds and the CPU seconds of the processes it started,
    with the seconds pytest's closing line gives where the command ran pytest (its output passes through)."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    tests = None
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        for line in run.stdout:
            sys.stdout.write(line)
            if found := PYTEST_LINE.search(line):
                tests = float(found.group(1))
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = {"returncode": run.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    return result | ({"pytest_s": tests} if tests is not None else {})


def _commit(cwd: Path | None) -> str | None:
    """The checkout's commit, or ``None`` outside one (or without git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def instruction_set() -> str | None:
    """The widest vector instructions the CPU offers torch's kernels (their speed differs most by it)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None


def measure(name: str, command: list[str], path: Path = TIMES, cwd: Path | None = None) -> dict[str, Any]:
    """Times ``command`` and keeps the result under ``name`` in ``path`` (only when it succeeded)."""
    if name not in WHAT:
        raise SystemExit(f"footprint: name={name!r} is not one of {sorted(WHAT)}")
    result = timed(command, cwd)
    result |= {
        "command": shlex.join(command),
        "measured": now(),
        "host": platform.node(),
        "cores": os.cpu_count(),
        "isa": instruction_set(),
        "commit": _commit(cwd),
    }
    if result["returncode"] == 0:
        record = json.loads(path.read_text()) if path.exists() else {}
        record[name] = result
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return result


def duration(seconds: float) -> str:
    """``87 s``, ``4 min 54 s``: as the README says times."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def times() -> dict[str, Any]:
    return json.loads(TIMES.read_text())


def table() -> str:
    """The footprint's table of times, one row a timed command."""
    rows = ["| what | wall | CPU (every process) | measured | command |", "|---|---|---|---|---|"]
    for name, run in times().items():
        when = f"{run['measured'][:10]}, {run['cores']} cores" + (f" ({run['isa']})" if run.get("isa") else "")
        when += f", at {run['commit']}" if run["commit"] else ""
        rows.append(
            f"| {WHAT[name]} | {duration(run['wall_s'])} | {duration(run['cpu_s'])} | {when} | `{run['command']}` |"
        )
    return "\n".join(rows) + "\n"


def sizes_table() -> str:
    """The footprint's table of checkpoint sizes, in MB."""
    sizes = json.loads((TIMES.parent / "checkpoint_size.json").read_text())["megabytes"]
    return "\n".join(["| checkpoint | MB |", "|---|---|", *(f"| {k} | {v:.2f} |" for k, v in sizes.items())]) + "\n"


def suite_time() -> str:
    """The README's sentence on the test command's time."""
    run = times()["suite"]
    return (
        f"The README's test command takes {duration(run['wall_s'])} on a fresh clone with 2 idle cores"
        + (f" ({run['isa']})" if run.get("isa") else "")
        + ", its install\n"
        f"included, the tests alone {duration(run['pytest_s'])}"
        " ([footprint](benchmarks/results/footprint/README.md)).\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(WHAT))
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command, as a user types it")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    result = measure(args.name, command)
    print(json.dumps(result, indent=1))
    raise SystemExit(result["returncode"])


if __name__ == "__main__":
    main()
