"""Time to reach plain Lightning's validation quality with hybrid training, measured side by side.

    python -m benchmarks.run --task char_gpt --seeds 3          # the default length (600 steps)
    python -m benchmarks.run --task all --quick                 # every task, a minute or two
    python -m benchmarks.run --task char_gpt --long predictor=rssm hybrid.confidence_threshold=0.3
    python -m benchmarks.run --task all --seeds 5 --threads 1    # quieter on a shared CPU: results/cpu_1thread

Per seed the baseline (the same experiment with plain Lightning: same module, optimizer, LR schedule, batch
order and seed) and the hybrid run alternate in this process, so drift of the machine hits both. The target is
the baseline's final validation loss; hybrid may train up to 1.5x the baseline's steps to reach it. Trailing
arguments are Hydra overrides of the app config, applied to both runs. Writes ``<task>_<length>_<name>.json``
and ``.png`` into ``--out`` and rewrites ``table.md`` there from every result in it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import fit, hybrid_against, label, machine, results_folder, summarize, warm_up, write_atomic
from benchmarks.report import plot_task, write_table
from benchmarks.tasks import TASKS, Length, compose_run, hybrid_steps, length_of

CPU_TASKS = ("char_gpt", "digits_cnn", "word_lstm")  # `--task all`; the GPT-2-sized one is for GPUs


def run_task(task: str, spec: Length, seeds: int, overrides: list[str], workdir: str) -> dict[str, Any]:
    warm_up(task, spec, overrides, workdir)
    per_seed = []
    for seed in range(seeds):
        baseline = fit(compose_run(task, spec, seed, overrides, workdir), hybrid=False)
        per_seed.append(hybrid_against(task, spec, seed, overrides, workdir, baseline, hybrid_steps(spec)))
        speedup = per_seed[-1]["to_target"][per_seed[-1]["clock"]]["speedup"]
        print(f"{task} seed {seed}: target {per_seed[-1]['target']:.4f}, speedup {speedup}")
    return {"task": task, "length": spec.name, "steps": spec.steps, "overrides": overrides, "seeds": per_seed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="all", choices=[*TASKS, "all"], help="all: every task but char_gpt_gpt2")
    parser.add_argument("--seeds", type=int, default=3)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", const="quick", dest="length", help="a few dozen steps")
    group.add_argument("--long", action="store_const", const="long", dest="length", help="several thousand steps")
    parser.add_argument("--steps", type=int, default=None, help="train this many steps instead of a named length")
    parser.add_argument("--name", default=None, help="label of this hybrid configuration (default: from overrides)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: benchmarks/results/<device>, <device>_<N>thread with --threads; "
        "benchmarks/results/quick with --quick, which is not committed)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the app config, e.g. predictor=rssm")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    length = args.length or "default"
    name = args.name or label(args.overrides)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or results_folder(length, args.threads, device)
    out.mkdir(parents=True, exist_ok=True)
    for task in CPU_TASKS if args.task == "all" else [args.task]:
        with tempfile.TemporaryDirectory() as workdir:
            result = run_task(task, length_of(task, length, args.steps), args.seeds, args.overrides, workdir)
        save_result(out, result, name)
    print(write_table(out))


def save_result(out: Path, result: dict[str, Any], name: str) -> None:
    """Write one configuration's result as ``<task>_<length>_<name>.json`` and its plot beside it."""
    result |= {"name": name, "machine": machine(), "summary": summarize(result)}
    stem = f"{result['task']}_{result['length']}_{name}"
    write_atomic(out / f"{stem}.json", json.dumps(result, indent=1))
    plot_task(result, out / f"{stem}.png")


if __name__ == "__main__":
    main()
