"""The harness across learning rates: does a configuration buy what a better learning rate buys?

    python -m benchmarks.lrs sweep --task char_gpt          # plain at 5 rates (seed 0): the tuned rate
    python -m benchmarks.lrs grid --task char_gpt           # at tuned/3, tuned and 3x tuned: plain against search,
                                                            # and (tuned/3, tuned) against EMA and schedule-free
    python -m benchmarks.lrs report                         # one table and one plot per task
    python -m benchmarks.lrs grid --task finetune_lora_mid --config nudged --rate 3x --seeds 3 4
                                                            # a closer look at one cell: more seeds (the report
                                                            # reads the grid's own seeds, so every row compares
                                                            # the same ones)

The tuned rate is the sweep's best final validation loss. At each rate, per seed, plain (the baseline: same module,
schedule, seed and batches) and each configuration alternate in this process, one torch thread; each run is its own
result file, written as soon as it ends, and a run whose file exists is not run again, so a grid goes on where it
stopped, across sessions. The target is the baseline's final validation loss; a configuration may train 1.5x the
baseline's steps to reach it (stopping once it has). Reported: the time (CPU seconds, validation excluded) and the
backward passes to the target, plain's over the configuration's (>1 is faster), and the validation loss at equal
steps, as medians over seeds (a seed that never reaches the target counts as the slowest); and, as the reference,
what the tuned rate itself buys: plain at the tuned rate's time to each rate's target.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from omegaconf import open_dict

from benchmarks.curves import Curve, Point
from benchmarks.peers import PEERS
from benchmarks.report import write_atomic
from benchmarks.run import RESULTS, Record, baseline_target, fit, machine, warm_up
from benchmarks.tasks import compose_run, hybrid_steps, length_of
from lightning_hybrid.demos.finetune import fingerprint, pretrained_weights

OUT = RESULTS / "lrs"
SWEEP = (1 / 9, 1 / 3, 1.0, 3.0, 9.0)  # times the task's own rate
RATES = ("tuned/3", "tuned", "3x")  # the grid's rates, by the names the command line takes
# `outer` as SNOO publishes it, without the guards its defaults now carry: each configuration below adds its own
UNGUARDED = ["predictor=outer", "predictor.keep_norms=false", "predictor.restart=false"]
UNGUARDED += ["predictor.verify_resolution=0"]
# jumps that change direction, not each tensor's scale, with no jump (and the momentum reset) where a cycle points
# against the momentum
OUTER_NORM_RESTART = [*UNGUARDED, "predictor.keep_norms=true", "predictor.restart=true"]
HYBRID = {  # configuration -> overrides
    "outer": UNGUARDED,
    "outer_aligned": [*UNGUARDED, "predictor.alignment_window=5"],  # jumps stop once training walks them back
    "outer_norm": [*UNGUARDED, "predictor.keep_norms=true"],  # jumps change direction, not each tensor's scale
    "outer_norm_aligned": [*UNGUARDED, "predictor.keep_norms=true", "predictor.alignment_window=5"],  # both
    "outer_norm_restart": OUTER_NORM_RESTART,
    # the same, making no jump where a cycle's losses spread too widely for the delayed verdict to see a 20% rise:
    # the defaults (`keep_norms`, `restart`, `verify_resolution=0.2`), so no override at all
    "outer_norm_restart_res": [],
    "outer_norm_restart_mu6": [*OUTER_NORM_RESTART, "predictor.outer_momentum=0.6"],  # 0.7 / 0.4 = 1.75 cycles
}
# Controls: plain, changed by what should not matter. Their rows read the floor's test on noise alone: a cell where
# plain at a rate 0.1% higher "misses" the floor is one where 5 seeds cannot tell a rule's cost from chaos.
# `rerun` is plain again at the same rate: on the host that ran the baseline it is plain's curve bit for bit, and
# on another host it measures what rounding alone does to a baseline from an earlier session.
CONTROLS = {"nudged": 1.001, "rerun": 1.0}  # configuration -> the rate's factor
CONFIGS = (*HYBRID, *PEERS, *CONTROLS)
# configurations whose stored runs the report still reads, of rules that measured no gain and left the package: the
# probe-verified line search along the last update and along the mean of the 6 updates between searches
RETIRED = ("search", "search_span")


@dataclass(frozen=True)
class LrTask:
    """A harness task at a fixed length, and how many seeds its grid runs (3 above 0.5M parameters)."""

    task: str
    steps: int
    seeds: int


LR_TASKS = {
    "char_gpt": LrTask("char_gpt", 1000, 5),
    "word_lstm": LrTask("word_lstm", 600, 5),
    "digits_cnn": LrTask("digits_cnn", 600, 5),
    "char_gpt_wsd": LrTask("char_gpt_wsd", 1000, 5),
    "char_gpt_mid": LrTask("char_gpt_mid", 1000, 3),
    "finetune_lora": LrTask("finetune_lora", 400, 5),
    "finetune_full": LrTask("finetune_full", 400, 5),
    "finetune_lora_mid": LrTask("finetune_lora_mid", 400, 3),
    "finetune_full_mid": LrTask("finetune_full_mid", 400, 3),
}


def _record(data: dict[str, Any]) -> Record:
    curve = Curve([Point(**p) for p in data["points"]], [(Point(**a), Point(**b)) for a, b in data["segments"]])
    return Record(curve, data["device"], data["steps"], data["backward_skipped_pct"], data["rollbacks"])


def _path(task: str, lr: float, seed: int, config: str) -> Path:
    return OUT / task / f"lr{lr:.3g}_seed{seed}_{config}.json"


def _pretrained(cfg: Any) -> dict[str, str]:
    """A fine-tuning run's pretrained weights, by fingerprint (none for other tasks): they are built on the machine
    that runs, where they may round otherwise, and a run compares only with a baseline that started from the same."""
    model = cfg.model
    if "pretrain_steps" not in model:
        return {}
    args = (model.n_layer, model.n_head, model.n_embd, model.block_size, model.pretrain_steps)
    return {"pretrained": fingerprint(pretrained_weights(*args))}


def _own_lr(task: str) -> float:
    return float(compose_run(LR_TASKS[task].task, "default", 0, [], tempfile.gettempdir()).model.lr)


def _run(task: str, lr: float, seed: int, config: str, workdir: str, baseline: Record | None) -> Record:
    """One run, or its result file if it exists (``baseline``: the seed's plain run, for the budget and stop)."""
    path = _path(task, lr, seed, config)
    if path.exists():
        return _record(json.loads(path.read_text()))
    spec = length_of(LR_TASKS[task].task, "default", LR_TASKS[task].steps)
    rate = lr * CONTROLS.get(config, 1.0)
    cfg = compose_run(LR_TASKS[task].task, spec, seed, [f"model.lr={rate}", *HYBRID.get(config, [])], workdir)
    stop, peers = None, [PEERS[config]()] if config in PEERS else []
    if baseline is not None:
        with open_dict(cfg):
            cfg.trainer.max_steps = hybrid_steps(spec)
        stop = baseline_target(baseline, spec)
    record = fit(cfg, hybrid=config in HYBRID, stop=stop, callbacks=peers)
    meta = {
        "task": task,
        "lr": lr,
        "trained_lr": rate,
        "seed": seed,
        "config": config,
        "steps": spec.steps,
        "machine": machine(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **_pretrained(cfg),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(meta | record.to_dict(), indent=1))
    print(f"{task} lr {lr:.3g} seed {seed} {config}: final val loss {record.curve.losses[-1]:.4f}", flush=True)
    return record


def sweep(task: str) -> float:
    """Plain at each rate of the sweep (seed 0); returns the tuned rate (the best final validation loss)."""
    own = _own_lr(task)
    with tempfile.TemporaryDirectory() as workdir:
        warm_up(LR_TASKS[task].task, length_of(LR_TASKS[task].task, "default"), [], workdir)
        finals = {own * f: _run(task, own * f, 0, "plain", workdir, None).curve.losses[-1] for f in SWEEP}
    return min(finals, key=lambda lr: finals[lr] if finals[lr] == finals[lr] else float("inf"))


def tuned(task: str) -> float:
    own = _own_lr(task)
    finals = {}
    for f in SWEEP:
        path = _path(task, own * f, 0, "plain")
        if not path.exists():
            raise SystemExit(f"{task}: no sweep result at lr {own * f:.3g}; run `python -m benchmarks.lrs sweep` first")
        loss = json.loads(path.read_text())["points"][-1]["val_loss"]
        finals[own * f] = loss if loss == loss else float("inf")
    return min(finals, key=finals.get)


def grid_rates(best: float) -> dict[str, float]:
    """The grid's rates by name, computed as every stored run's were (``best / 3`` and ``best * (1 / 3)`` differ in
    the last bit at some rates, and a baseline is plain's curve bit for bit only at the same rate)."""
    return dict(zip(RATES, (best / 3, best, best * 3), strict=True))


def grid_plan(
    task: str, configs: list[str], seeds: list[int] | None = None, rates: list[str] | None = None
) -> list[tuple[float, int, list[str]]]:
    """``(lr, seed, configurations)`` to run: the hybrid configurations and the controls at three rates over the
    task's seeds, the peers at the under-tuned and the tuned rate over 3 seeds. ``seeds`` and ``rates`` (of
    :data:`RATES`) narrow or extend that, to look closer at one cell."""
    by_name, plan = grid_rates(tuned(task)), []
    for name in rates or RATES:
        lr = by_name[name]
        for seed in range(LR_TASKS[task].seeds) if seeds is None else seeds:
            here = [c for c in configs if c not in PEERS or (name != "3x" and seed < 3)]
            plan.append((lr, seed, here))
    return plan


def grid(task: str, configs: list[str], seeds: list[int] | None = None, rates: list[str] | None = None) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        warm_up(LR_TASKS[task].task, length_of(LR_TASKS[task].task, "default"), [], workdir)
        for lr, seed, here in grid_plan(task, configs, seeds, rates):
            baseline = _run(task, lr, seed, "plain", workdir, None)
            for config in here:
                _run(task, lr, seed, config, workdir, baseline)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("sweep", "grid", "report"))
    parser.add_argument("--task", action="append", choices=list(LR_TASKS), help="default: every task")
    parser.add_argument("--config", action="append", choices=CONFIGS, help="default: search and the peers")
    parser.add_argument("--rate", action="append", choices=RATES, help="grid: default every rate")
    parser.add_argument("--seeds", type=int, nargs="+", help="grid: default the task's seeds (the report's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tasks = args.task or list(LR_TASKS)
    if args.action == "report":
        from benchmarks.lrs_report import report

        print(report(tasks))
        return
    for task in tasks:
        if args.action == "sweep":
            print(f"{task}: tuned lr {sweep(task):.3g}")
        else:
            grid(task, args.config or ["outer_norm_restart_res", *PEERS], args.seeds, args.rate)


if __name__ == "__main__":
    main()
