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
import functools
import json
import math
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from omegaconf import open_dict

from benchmarks.curves import overfits, time_to_target, value_at
from benchmarks.harness import (
    HYBRID,
    RESULTS,
    Record,
    baseline_target,
    fit,
    machine,
    now,
    record_from,
    stamp,
    warm_up,
    write_atomic,
)
from benchmarks.peers import PEERS
from benchmarks.report import median_over_seeds, seeds_cell
from benchmarks.tasks import compose_run, hybrid_steps, length_of, trainer_steps
from lightning_hybrid.demos.finetune import fingerprint, pretrained_weights

OUT = RESULTS / "lrs"
SWEEP = (1 / 9, 1 / 3, 1.0, 3.0, 9.0)  # times the task's own rate
RATES = ("tuned/3", "tuned", "3x")  # the grid's rates, by the names the command line takes
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
    "char_gpt_muon": LrTask("char_gpt_muon", 1000, 5),
    "finetune_lora": LrTask("finetune_lora", 400, 5),
    "finetune_full": LrTask("finetune_full", 400, 5),
    "finetune_lora_mid": LrTask("finetune_lora_mid", 400, 3),
    "finetune_full_mid": LrTask("finetune_full_mid", 400, 3),
}


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


@functools.cache
def _own_lr(task: str) -> float:
    return float(compose_run(LR_TASKS[task].task, "default", 0, [], tempfile.gettempdir()).model.lr)


def _run(task: str, lr: float, seed: int, config: str, workdir: str, baseline: Record | None) -> Record:
    """One run, or its result file if it exists (``baseline``: the seed's plain run, for the budget and stop)."""
    path = _path(task, lr, seed, config)
    if path.exists():
        return record_from(json.loads(path.read_text()))
    spec = length_of(LR_TASKS[task].task, "default", LR_TASKS[task].steps)
    rate = lr * CONTROLS.get(config, 1.0)
    cfg = compose_run(LR_TASKS[task].task, spec, seed, [f"model.lr={rate}", *HYBRID.get(config, [])], workdir)
    stop, peers = None, [PEERS[config]()] if config in PEERS else []
    if baseline is not None:
        with open_dict(cfg):
            cfg.trainer.max_steps = trainer_steps(LR_TASKS[task].task, hybrid_steps(spec))
        stop = baseline_target(baseline, spec)
    started = now()
    record = fit(cfg, hybrid=config in HYBRID, stop=stop, callbacks=peers)
    meta = {
        "task": task,
        "lr": lr,
        "trained_lr": rate,
        "seed": seed,
        "config": config,
        "steps": spec.steps,
        "machine": machine(),
        **stamp(started),
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


# -- the report: per task, a table and a plot of time to target against the learning rate for each configuration,
# beside plain at the tuned rate (results/lrs/<task>.md and .png, and results/lrs/README.md with every table) ----

AXES = {"cpu_s": "CPU time", "backward": "backward passes"}
LABELS = {"tuned/3": "tuned/3", "tuned": "tuned", "3x": "3x tuned"}  # the report's words for the grid's rates
APART_HOURS = 3  # a configuration's run and its plain baseline ended further apart than this: flagged


def _ratios(base: Any, other: Any, target: float) -> dict[str, float | None]:
    """Plain's time (and backward passes) to ``target`` over ``other``'s; ``None`` where ``other`` never got there."""
    out = {}
    for axis in AXES:
        tb = time_to_target(base.curve.axis(axis), base.curve.losses, target)
        to = time_to_target(other.curve.axis(axis), other.curve.losses, target)
        out[axis] = tb / to if tb and to else None
    return out


def seed_rows(task: str, lr: float, config: str, best: float) -> list[dict[str, Any]]:
    """Per seed with results: the configuration against plain at the same rate (``config="tuned"``: plain at the
    tuned rate against plain at this one)."""
    rows = []
    for seed in range(LR_TASKS[task].seeds):
        base = _path(task, lr, seed, "plain")
        other = _path(task, best, seed, "plain") if config == "tuned" else _path(task, lr, seed, config)
        if not (base.exists() and other.exists()):
            continue
        ours, theirs = json.loads(base.read_text()), json.loads(other.read_text())
        b, o = record_from(ours), record_from(theirs)
        target, steps = b.curve.losses[-1], b.curve.points[-1].step  # no target where plain overfits (``_times``)
        at = value_at([p.step for p in o.curve.points], o.curve.losses, steps)
        cost = value_at([p.step for p in o.curve.points], o.curve.axis("cpu_s"), steps)  # probes included
        row = {"seed": seed, **_ratios(b, o, target), "loss": None if at is None else at / target}
        row["overfit"] = overfits(b.curve.losses)
        row["cost"] = None if cost is None else cost / b.curve.points[-1].cpu_s
        row["hours_apart"], row["other_host"] = _hours_apart(ours, theirs), _other_host(ours, theirs)
        rows.append(row | {"kept": theirs["segments_started"]})  # search: the line-search steps it kept
    return rows


def _other_host(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs ran on different machines (their platform strings differ) or, fine-tuning, from different
    pretrained weights (fingerprints differ, or one run has none): the grid alternates plain and each configuration
    in one process, but a configuration added in a later session meets a baseline run on another machine, whose
    kernels may round differently (at a high rate that alone parts two runs of plain), and whose pretraining did."""
    platform = [(run.get("machine") or {}).get("platform") for run in (a, b)]
    return platform[0] != platform[1] or a.get("pretrained") != b.get("pretrained")


def _hours_apart(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """Hours between two runs' ends (``None`` where neither is stamped; ``inf`` where one is, since stamping began
    after the other ran): the CPU times of runs
    far apart met different loads on a shared machine, so their ratio is not a measurement."""
    if "finished" not in a and "finished" not in b:
        return None
    if "finished" not in a or "finished" not in b:  # stamps began on 2026-11-25: one run is older than that
        return math.inf
    return abs(datetime.fromisoformat(a["finished"]) - datetime.fromisoformat(b["finished"])).total_seconds() / 3600


def _times(rows: list[dict], axis: str) -> list[float | None]:
    """The seeds' times to target on ``axis``, leaving out the seeds whose plain run overfits (no target there)."""
    return [r[axis] for r in rows if not r.get("overfit")]


def _untargeted(rows: list[dict]) -> bool:
    """Whether plain overfits in every seed of a cell: then nothing there has a time to target."""
    return all(r.get("overfit") for r in rows)


def time_cell(rows: list[dict], axis: str) -> str:
    over = sum(bool(r.get("overfit")) for r in rows)
    if over == len(rows):
        return f"none: plain overfits in {over} of {over}"
    return seeds_cell(_times(rows, axis)) + (f"; plain overfits in {over} of {len(rows)}" if over else "")


def _apart(rows: list[dict]) -> bool:
    return any((r.get("hours_apart") or 0) > APART_HOURS for r in rows)


def _hosts(rows: list[dict]) -> str:
    """``"k of n"`` seeds whose baseline ran on another machine, or ``""`` for none."""
    other = sum(bool(r.get("other_host")) for r in rows)
    return f"{other} of {len(rows)}" if other else ""


def task_table(task: str) -> tuple[str, dict[str, dict[float, list[dict]]]]:
    best, own = tuned(task), _own_lr(task)
    sweep = {own * f: json.loads(_path(task, own * f, 0, "plain").read_text())["points"][-1]["val_loss"] for f in SWEEP}
    lines = [
        f"### {task} ({LR_TASKS[task].steps} steps)",
        "",
        "Plain sweep (seed 0), final validation loss: "
        + ", ".join(f"lr {lr:.3g}: {loss:.4f}" + (" (tuned)" if lr == best else "") for lr, loss in sweep.items()),
        "",
        "| lr | configuration | seeds | CPU time to target, plain/config | backward passes to target"
        " | val loss at equal steps, config/plain | CPU time at equal steps, config/plain |",
        "|---|---|---|---|---|---|---|",
    ]
    found: dict[str, dict[float, list[dict]]] = {}
    for lr in grid_rates(best).values():
        for config in ("tuned", *CONFIGS, *RETIRED):
            rows = seed_rows(task, lr, config, best)
            if not rows or (config == "tuned" and lr == best):
                continue
            found.setdefault(config, {})[lr] = rows
            name = "plain at the tuned lr" if config == "tuned" else _label(config)
            rate = f"{lr:.3g}{' (tuned)' if lr == best else ''}"
            cells = [time_cell(rows, axis) for axis in AXES]
            cells += [seeds_cell([r[key] for r in rows], ".3f", "") for key in ("loss", "cost")]
            lines.append(f"| {rate} | {name} | {len(rows)} | " + " | ".join(cells) + " |")
    apart = [(c, lr) for c, by_lr in found.items() if c != "tuned" for lr, rows in by_lr.items() if _apart(rows)]
    if apart:
        lines += [
            "",
            f"CPU times of runs that ended more than {APART_HOURS} h from their baseline (another session's"
            " load; read backward passes there): " + ", ".join(f"`{c}` at {lr:.3g}" for c, lr in apart),
        ]
    hosts = [(c, lr, _hosts(rows)) for c, by_lr in found.items() if c != "tuned" for lr, rows in by_lr.items()]
    if any(h for *_, h in hosts):
        lines += [
            "",
            "Compared with a baseline that ran on another machine or, fine-tuning, from other pretrained weights"
            " (seeds), whose rounding may differ: at a high rate that alone parts two runs of plain, as `rerun`"
            " shows where it ran: " + ", ".join(f"`{c}` at {lr:.3g} ({h})" for c, lr, h in hosts if h),
        ]
    for config in (*HYBRID, *RETIRED):  # the candidates for the default, then and now
        if config in found:
            lines += ["", *goals(task, found, config)]
    return "\n".join(lines), found


def _label(config: str) -> str:
    if config in CONTROLS and CONTROLS[config] == 1.0:
        return f"`{config}` (control: plain run again)"
    if config in CONTROLS:
        return f"`{config}` (control: plain at {CONTROLS[config]:g}x the rate)"
    return f"`{config}`"


# Issue 32's goals: the floor (time and loss at equal steps), and the speedups at the under-tuned and the tuned rate
FLOOR_TIME, FLOOR_LOSS, UNDER_TUNED, TUNED = 0.97, 1.005, 1.15, 1.1
TUNED_TASKS = ("char_gpt", "word_lstm")


def _median(rows: list[dict], key: str) -> float | None:
    return median_over_seeds([r[key] for r in rows])


def _floor(rows: list[dict]) -> tuple[str, float | None, float | None, bool]:
    """The clock a cell is judged on, its median time and loss, and whether they hold the floor."""
    clock = "backward" if _apart(rows) else "cpu_s"
    time, loss = median_over_seeds(_times(rows, clock)), _median(rows, "loss")
    return clock, time, loss, time is not None and time >= FLOOR_TIME and loss is not None and loss <= FLOOR_LOSS


def _said(rows: list[dict]) -> str:
    """A cell's median time and loss, as the floor reads them."""
    clock, time, loss, _ = _floor(rows)
    mark = "" if clock == "cpu_s" else " bwd"
    time_said = "not reached" if time is None else f"{time:.2f}x{mark}"
    return f"{time_said}, {'-' if loss is None else f'{loss:.3f}'}"


def _near(lr: float, rate: float) -> bool:
    return abs(lr / rate - 1) < 1e-6


def _rate(lr: float, best: float) -> str:
    return next((LABELS[name] for name, rate in grid_rates(best).items() if _near(lr, rate)), f"lr {lr:.3g}")


def floor_summary(found_by_task: dict[str, dict[str, dict[float, list[dict]]]]) -> str:
    """Per hybrid configuration, the cells (task and rate) that hold the floor and those that miss it: item 5's
    test for a default is that none misses, on every task at every rate. The controls' rows read the same test on
    plain training nudged by what should not matter: where they miss, the test reads noise, so each miss is given
    beside the controls' figures in the same cell, and the misses where every control that ran held (or none ran)
    are counted apart."""
    lines = [
        f"The floor (>= {FLOOR_TIME}x time to target, <= {FLOOR_LOSS} loss at equal steps, medians; a seed that"
        " never reached the target counts as the slowest) across the grid, and the misses where no control of plain"
        " missed too:",
        "",
        "| configuration | cells measured | floor held | missed where no control missed"
        " | missed (task at lr: time, loss; the control's there) | no target: plain overfits in every seed |",
        "|---|---|---|---|---|---|",
    ]
    for config in (*HYBRID, *RETIRED, *CONTROLS):
        held, own, missed, untargeted = 0, 0, [], []
        for task, found in found_by_task.items():
            best = tuned(task)
            for lr, rows in sorted(found.get(config, {}).items()):
                if _untargeted(rows):
                    untargeted.append(f"{task} at {_rate(lr, best)}")
                    continue
                ok = _floor(rows)[3]
                held += ok
                if not ok:
                    controls = [c for c in CONTROLS if c != config and lr in found.get(c, {})]
                    own += all(_floor(found[c][lr])[3] for c in controls)
                    control = [f"{c} {_said(found[c][lr])}" for c in controls]
                    beside = f" (control {'; '.join(control)})" if control else ""
                    other = _hosts(rows)
                    hosts = f" [baseline on another machine: {other}]" if other else ""
                    missed.append(f"{task} at {_rate(lr, best)}: {_said(rows)}{hosts}{beside}")
        cells = held + len(missed) + len(untargeted)
        if cells:
            lost = "; ".join(untargeted) or "none"
            lines.append(f"| {_label(config)} | {cells} | {held} | {own} | {'; '.join(missed) or 'none'} | {lost} |")
    return "\n".join(lines)


def goals(task: str, found: dict[str, dict[float, list[dict]]], config: str = "search") -> list[str]:
    """Each goal of the candidate default at each rate, met or not, from the medians over seeds. Time is CPU time,
    or backward passes where a run ended far from its baseline (their CPU times met different loads)."""
    best, lines = tuned(task), []
    for name, rate in grid_rates(best).items():
        lr = next((x for x in found.get(config, {}) if _near(x, rate)), None)
        rows = found[config][lr] if lr is not None else []
        if not rows:
            lines.append(f"- {LABELS[name]}: not measured")
            continue
        if _untargeted(rows):
            lines.append(f"- {LABELS[name]}: no target, plain overfits in every seed ({len(rows)})")
            continue
        clock, time, _, floor = _floor(rows)
        said = [f"floor (>= {FLOOR_TIME}x time, <= {FLOOR_LOSS} loss) {'met' if floor else 'NOT met'}"]
        if name == "tuned/3":
            said.append(f"under-tuned goal >= {UNDER_TUNED}x {'met' if (time or 0) >= UNDER_TUNED else 'NOT met'}")
        if name == "tuned" and task in TUNED_TASKS:
            said.append(f"tuned goal >= {TUNED}x {'met' if (time or 0) >= TUNED else 'NOT met'}")
        for peer in ("ema", "schedulefree"):
            theirs = found.get(peer, {}).get(lr, [])
            other = median_over_seeds(_times(theirs, clock))
            if not theirs:
                continue
            if other is None or time is None:
                said.append(f"`{peer}` {time_cell(theirs, clock)}")
            else:
                side = "ahead of" if time >= other else "behind"
                said.append(f"{side} `{peer}` ({other:.2f}x) by {max(time, other) / min(time, other):.2f}x")
        judged = "" if clock == "cpu_s" else "; judged on backward passes: CPU times from another session"
        lines.append(
            f"- {LABELS[name]} ({len(rows)} seeds{judged}, time {time_cell(rows, 'cpu_s')}, backward passes "
            f"{time_cell(rows, 'backward')}, loss "
            f"{seeds_cell([r['loss'] for r in rows], '.3f', '')}, "
            f"steps kept {seeds_cell([r['kept'] for r in rows], '.0f', '')}): " + "; ".join(said)
        )
    head = f"Goals for `{config}` (medians over seeds; time to target, plain/config: CPU time, or backward passes"
    return [head + " where marked):", "", *lines]


def plot(task: str, found: dict[str, dict[float, list[dict]]], path: Path) -> None:
    """Time to target (plain/config, CPU time) against the learning rate: each configuration's median with its
    range over seeds, and plain at the tuned rate as the reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for config, by_lr in found.items():
        lrs = sorted(by_lr)
        values = [_times(by_lr[lr], "cpu_s") for lr in lrs]
        kept = [(lr, [x for x in v if x is not None], median_over_seeds(v)) for lr, v in zip(lrs, values)]
        kept = [(lr, v, m) for lr, v, m in kept if m is not None]
        if not kept:
            continue
        xs = [lr for lr, *_ in kept]
        med = [m for *_, m in kept]
        low = [m - min(v) for _, v, m in kept]
        high = [max(v) - m for _, v, m in kept]
        style = {"linestyle": "--", "color": "black"} if config == "tuned" else {"marker": "o"}
        label = "plain at the tuned lr (reference)" if config == "tuned" else config
        ax.errorbar(xs, med, yerr=[low, high], label=label, capsize=3, **style)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("time to plain's final loss, plain / config (CPU)")
    ax.set_title(f"{task}: >1 reaches plain's quality sooner")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def idle_cost(found_by_task: dict[str, dict[str, dict[float, list[dict]]]], config: str = "search") -> str:
    """What ``config`` costs where it steps aside: its runs that kept nothing train plain's exact curve, so their
    CPU time at equal steps over plain's is the cost of looking (the probe's evaluations, the guard) and noise."""
    idle = [
        r["cost"]
        for found in found_by_task.values()
        for rows in found.get(config, {}).values()
        for r in rows
        if r["kept"] == 0 and r["cost"] is not None
    ]
    if not idle:
        return f"No `{config}` run kept nothing yet."
    return (
        f"Where `{config}` kept no step ({len(idle)} runs, every task and rate), it trained plain's curve at "
        f"{seeds_cell(idle, '.3f', '')} plain's CPU time at equal steps: the cost of searching, with the noise of "
        "a shared machine."
    )


def report(tasks: list[str]) -> str:
    sections, found_by_task = [], {}
    for task in tasks:
        try:
            table, found = task_table(task)
        except (SystemExit, FileNotFoundError):
            sections.append(f"### {task}\n\nNo sweep yet.")
            continue
        write_atomic(OUT / f"{task}.md", table + "\n")
        if found:
            plot(task, found, OUT / f"{task}.png")
        sections.append(table)
        found_by_task[task] = found
    made = (
        "Made by `python -m benchmarks.lrs report` from the run files in the task folders beside it; each run file "
        "records the machine it ran on (`machine`) and when it ended (`finished`); since 2026-11-29 its process "
        "(`process`: host, pid) and start (`started`) too."
    )
    head = "# Across learning rates\n\n" + __doc__.split("\n\n")[0] + " " + made + "\n\n" + idle_cost(found_by_task)
    head += "\n\n" + floor_summary(found_by_task)
    text = head + "\n\n" + "\n\n".join(sections) + "\n"
    write_atomic(OUT / "README.md", text)
    return text


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
        print(report(tasks))
        return
    for task in tasks:
        if args.action == "sweep":
            print(f"{task}: tuned lr {sweep(task):.3g}")
        else:
            grid(task, args.config or ["outer_norm_restart_res", *PEERS], args.seeds, args.rate)


if __name__ == "__main__":
    main()
