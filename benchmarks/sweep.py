"""Sweep hybrid configurations against one plain baseline per seed, on the harness's tasks and measures.

    python -m benchmarks.sweep --task char_gpt --steps 2000 --grid outer --threads 1
    python -m benchmarks.sweep --task char_gpt --setting "predictor=outer hybrid.full_steps=20"

Each seed trains the plain baseline once, then every configuration with the same seed, batches and schedule, for
the baseline's steps (a sweep compares losses at equal steps), or with ``--budget harness`` for up to 1.5x those
steps, stopping as ``benchmarks.run`` does: the seeded runs of a few configurations that share their baselines.
Each configuration's result is written as the harness writes one (``<task>_<length>_<name>.json``), and
``table.md`` in ``--out`` is rewritten from all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import tempfile
from pathlib import Path

import torch

from benchmarks.lrs import UNGUARDED
from benchmarks.report import write_table
from benchmarks.run import RESULTS, fit, hybrid_against, label, save_result, warm_up
from benchmarks.tasks import TASKS, Length, compose_run, hybrid_steps, length_of


def outer(k: int, eta: float, mu: float, verify: bool = True) -> tuple[str, list[str]]:
    """The outer-momentum rule without the default's guards (as these sweeps ran it) with cycles of ``k`` steps,
    verified over the last half of the next cycle (or, with ``verify=False``, every jump kept unchecked)."""
    return f"outer_K{k}_eta{eta}_mu{mu}" + ("" if verify else "_unverified"), [
        *UNGUARDED,
        f"hybrid.full_steps={k}",
        f"predictor.verify_window={k // 2 if verify else 0}",
        f"predictor.outer_lr={eta}",
        f"predictor.outer_momentum={mu}",
    ]


GRIDS: dict[str, list[tuple[str, list[str]]]] = {
    # 12 settings from K in {10, 20, 50}, eta in {0.5, 0.7, 0.9}, mu in {0.3, 0.5, 0.75, 0.9}: dense around the
    # prototype's best (K=20, eta=0.7, mu=0.5), plus the published defaults' neighbourhood (K=50, mu=0.9)
    "outer": [
        outer(20, 0.7, 0.5),
        outer(20, 0.7, 0.3),
        outer(20, 0.9, 0.5),
        outer(20, 0.5, 0.5),
        outer(20, 0.7, 0.75),
        outer(20, 0.9, 0.3),
        outer(10, 0.7, 0.5),
        outer(10, 0.9, 0.3),
        outer(10, 0.5, 0.3),
        outer(50, 0.7, 0.5),
        outer(50, 0.7, 0.9),
        outer(50, 0.9, 0.75),
    ],
    # for a second task on a budget: the three cycle lengths at the prototype's best step and momentum, and the
    # step and momentum around it at K=20
    "outer_subset": [
        outer(20, 0.7, 0.5),
        outer(20, 0.9, 0.5),
        outer(20, 0.7, 0.3),
        outer(10, 0.7, 0.5),
        outer(50, 0.7, 0.5),
        outer(20, 0.5, 0.5),
    ],
    # char_gpt_mid, where the chosen setting loses: a smaller effective step (eta / (1 - mu) = 0.71 against 1.4),
    # a larger one (1.8), and the longer cycle that was best on the small char GPT
    "outer_mid": [outer(20, 0.5, 0.3), outer(20, 0.9, 0.5), outer(50, 0.7, 0.5)],
    # the smaller step that gained on char_gpt_mid's first seed, for its other seeds
    "mid_candidate": [outer(20, 0.5, 0.3)],
    # the chosen setting, with its delayed verification and without (the ablation)
    "chosen": [outer(20, 0.7, 0.5), outer(20, 0.7, 0.5, verify=False)],
    "chosen_verified": [outer(20, 0.7, 0.5)],
    "chosen_unverified": [outer(20, 0.7, 0.5, verify=False)],
}


def earlier_seeds(out: Path, task: str, spec: Length, name: str, overrides: list[str], first_seed: int) -> list[dict]:
    """The seeds below ``first_seed`` of an earlier result of the same configuration, so a sweep can be extended."""
    if first_seed == 0:
        return []
    path = out / f"{task}_{spec.name}_{name}.json"
    earlier = json.loads(path.read_text()) if path.exists() else None
    if earlier is None or earlier["overrides"] != overrides or earlier["steps"] != spec.steps:
        raise SystemExit(f"--first-seed {first_seed}: no earlier result of {name} with these steps in {out}")
    seeds = [s for s in earlier["seeds"] if s["seed"] < first_seed]
    if len(seeds) != first_seed:
        raise SystemExit(f"--first-seed {first_seed}: {path.name} holds seeds {[s['seed'] for s in seeds]}")
    return seeds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=list(TASKS))
    parser.add_argument("--length", default="default", help="the task's named length (its validation batches)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run instead of the named length's")
    parser.add_argument("--val-every", type=int, default=None, help="validate every N steps instead of the length's")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="extend earlier results in --out: keep their seeds below this one"
    )
    parser.add_argument("--grid", choices=list(GRIDS), action="append", default=[], help="a named set of settings")
    parser.add_argument("--setting", action="append", default=[], help="one configuration's Hydra overrides")
    parser.add_argument("--budget", choices=("equal", "harness"), default="equal", help="hybrid steps: equal or 1.5x")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=RESULTS / "sweep", help="results folder")
    args = parser.parse_args(argv)
    given = [shlex.split(s) for s in args.setting]
    settings = [s for grid in args.grid for s in GRIDS[grid]] + [(label(o), o) for o in given]
    if not settings:
        parser.error("give --grid or --setting")
    torch.set_num_threads(args.threads)
    spec = length_of(args.task, args.length, args.steps)
    if args.val_every is not None:
        spec = dataclasses.replace(spec, val_every=args.val_every, name=f"{spec.name}_val{args.val_every}")
    budget = spec.steps if args.budget == "equal" else hybrid_steps(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    per_setting = [
        earlier_seeds(args.out, args.task, spec, name, overrides, args.first_seed) for name, overrides in settings
    ]
    with tempfile.TemporaryDirectory() as workdir:
        warm_up(args.task, spec, [], workdir)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            baseline = fit(compose_run(args.task, spec, seed, [], workdir), hybrid=False)
            for (name, overrides), results in zip(settings, per_setting):
                results.append(hybrid_against(args.task, spec, seed, overrides, workdir, baseline, budget))
                print(f"{name} seed {seed}: val loss at equal steps {results[-1]['loss_ratio_equal_steps']}x plain's")
                result = {"task": args.task, "length": spec.name, "steps": spec.steps, "overrides": overrides}
                save_result(args.out, result | {"seeds": results}, name)
    print(write_table(args.out))


if __name__ == "__main__":
    main()
