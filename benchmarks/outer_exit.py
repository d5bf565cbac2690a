"""What does stopping `outer`'s jumps mid-run cost? The question behind the alignment verdict's losses.

    python -m benchmarks.outer_exit --task char_gpt --lr 0.009 --stop-at 420

An offline loop (the task's module, optimizer, schedule and batches, one torch thread, no Trainer) trains the same
seed five ways. Every ``full_steps`` steps after ``warmup`` it makes the :class:`OuterMomentum` jump (the library's
rule, η = 0.7, μ = 0.5) and reads the jump's alignment with the next cycle:

- ``plain``: no jumps;
- ``always``: every cycle;
- ``stop``: every cycle up to ``stop_at``, then none;
- ``wind_down``: from ``stop_at``, each jump smaller than the last (η towards 1 and μ towards 0 by ``0.7`` a
  cycle);
- ``verdict``: until the mean alignment of the last 5 jumps is at most 0 (``alignment_window=5``);
- ``stop_rescaled``: as ``stop``, and at the stop each tensor is scaled to the norm it has in ``plain`` at that
  step (a diagnostic: is what the jumps leave behind their weights' scale?);
- ``norm_kept`` and ``norm_kept_stop``: as ``always`` and ``stop``, with each tensor scaled back after every jump
  to the norm it had before it (``OuterMomentum(keep_norms=True)``: jumps that change the weights' direction, not
  their scale).

Recorded: the validation loss and the weights' norm along the run, and where the jumps stopped.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch

from benchmarks.extrapolation_delay import _batches, _loss, _train, offline
from benchmarks.report import write_atomic
from benchmarks.run import RESULTS
from lightning_hybrid.predictors import OuterMomentum

OUT = RESULTS / "outer_exit"
MODES = ("plain", "always", "stop", "wind_down", "verdict", "stop_rescaled", "norm_kept", "norm_kept_stop")
WIND_DOWN, WINDOW = 0.7, 5


def run(
    task: str,
    lr: float,
    mode: str,
    steps: int,
    stop_at: int,
    seed: int,
    norms: list[float] | None = None,
    **phases: int,
) -> dict[str, Any]:
    """One way through the same seed; ``phases``: ``warmup`` and ``full_steps`` (defaults 60 and 20); ``norms``:
    for ``stop_rescaled``, each tensor's norm in ``plain`` at the stop (``plain`` returns them)."""
    warmup, k = phases.get("warmup", 60), phases.get("full_steps", 20)
    o = offline(task, lr, seed)
    model, opt, sched, clip, params, val = o.model, o.opt, o.sched, o.clip, o.params, o.val
    stream, rule = _batches(o.data), OuterMomentum(0.7, 0.5, keep_norms=mode.startswith("norm_kept"), restart=False)
    rule.setup(params, keep_jump=True)
    _train(model, opt, sched, [next(stream) for _ in range(warmup)], clip)
    anchor = torch._foreach_mul(params, 1.0)
    points, alignments, jumped, stopped_at = [], [], False, None
    for step in range(warmup + k, steps + 1, k):
        _train(model, opt, sched, [next(stream) for _ in range(k)], clip)
        with torch.no_grad():
            if jumped:
                dot, jj, dd = rule.alignment_terms(params, anchor).tolist()
                alignments.append(dot / math.sqrt(jj * dd) if jj > 0 and dd > 0 else 0.0)
            norm = math.sqrt(sum(float(p.square().sum()) for p in params))
        if step % (5 * k) == 0 or step == steps:
            points.append({"step": step, "val_loss": _loss(model, val), "norm": norm})
        late = step >= stop_at
        if mode == "verdict" and stopped_at is None and len(alignments) >= WINDOW:
            stopped_at = step if sum(alignments[-WINDOW:]) <= 0 else None
        if mode == "plain" and late and norms is None:
            norms = [float(p.detach().norm()) for p in params]
        if mode in ("stop", "stop_rescaled", "norm_kept_stop") and late and stopped_at is None:
            stopped_at = step
            if mode == "stop_rescaled" and norms is not None:
                with torch.no_grad():
                    torch._foreach_mul_(params, [n / float(p.norm()) for n, p in zip(norms, params, strict=True)])
        if mode == "wind_down" and late:
            shrink = WIND_DOWN ** ((step - stop_at) // k + 1)
            rule.outer_lr, rule.outer_momentum = 1 - 0.3 * shrink, 0.5 * shrink
        jumped = mode != "plain" and stopped_at is None
        with torch.no_grad():
            if jumped:
                rule.jump(params, anchor)  # leaves the new point in ``anchor``
            else:
                torch._foreach_copy_(anchor, params)
    return {"mode": mode, "points": points, "alignments": alignments, "stopped_at": stopped_at, "norms": norms}


def to_markdown(task: str, lr: float, seed: int, runs: list[dict[str, Any]]) -> str:
    plain = {p["step"]: p["val_loss"] for p in runs[0]["points"]}
    head = f"### {task}, lr {lr:g}, seed {seed}: validation loss over plain's at the same step (norm in brackets)"
    steps = [p["step"] for p in runs[0]["points"]]
    lines = [head, "", "| mode | stopped at | " + " | ".join(str(s) for s in steps) + " |"]
    lines.append("|---" * (2 + len(steps)) + "|")
    for r in runs:
        cells = [f"{p['val_loss'] / plain[p['step']]:.4f} ({p['norm']:.1f})" for p in r["points"]]
        lines.append(f"| {r['mode']} | {r['stopped_at'] or '-'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="char_gpt")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--stop-at", type=int, default=420)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", choices=MODES[1:], default=list(MODES[1:]), help="besides plain")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = [run(args.task, args.lr, "plain", args.steps, args.stop_at, args.seed)]
    norms = runs[0]["norms"]
    runs += [run(args.task, args.lr, m, args.steps, args.stop_at, args.seed, norms) for m in args.modes]
    name = f"{args.task}_lr{args.lr:g}_seed{args.seed}" + ("" if args.modes == list(MODES[1:]) else "_some")
    OUT.mkdir(parents=True, exist_ok=True)
    write_atomic(OUT / f"{name}.json", json.dumps({"task": args.task, "lr": args.lr, "runs": runs}, indent=1))
    text = to_markdown(args.task, args.lr, args.seed, runs)
    write_atomic(OUT / f"{name}.md", text)
    print(text)


if __name__ == "__main__":
    main()
