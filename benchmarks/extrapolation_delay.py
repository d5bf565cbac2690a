"""Does a step along the mean update pay at once, or only later? The question behind `search` keeping nothing.

    python -m benchmarks.extrapolation_delay --task char_gpt --lr 0.003

Plain training (the task's module, optimizer, schedule and batches, one torch thread) runs to each fork point. There
the weights are moved by ``k`` times the mean update of the last ``span`` steps, for each ``k``, and from each moved
point (optimizer state and schedule as they were) training goes on over the same batches. Recorded for each ``k``:
the probe's loss at once (the run's first training batch, what `search` judges by) and the validation loss at once
and ``after`` steps later. ``k = 0`` is the run without the step: the counterfactual every other ``k`` is read
against.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import instantiate

from benchmarks.report import write_atomic
from benchmarks.run import RESULTS
from benchmarks.tasks import compose_run
from lightning_hybrid.outputs import loss_of

OUT = RESULTS / "extrapolation_delay"
MULTIPLES = (0, 1, 2, 4, 8, 16)


def _batches(data: Any) -> Any:
    while True:
        yield from data.train_dataloader()


@torch.no_grad()
def _loss(model: Any, batches: list[Any]) -> float:
    model.eval()
    value = sum(float(loss_of(model.training_step(b, i))) for i, b in enumerate(batches)) / len(batches)
    model.train()
    return value


def _train(model: Any, opt: Any, sched: Any, batches: list[Any], clip: float | None) -> None:
    for i, batch in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        model.training_step(batch, i).backward()  # the demos return the loss tensor
        if clip:  # as the task's Trainer clips (the word LSTM: by norm, at 0.25)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()


def _optimizer(conf: Any) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer and the scheduler (a constant one where the module has none) of ``configure_optimizers``."""
    if isinstance(conf, torch.optim.Optimizer):
        return conf, torch.optim.lr_scheduler.LambdaLR(conf, lambda _: 1.0)
    return conf["optimizer"], conf["lr_scheduler"]["scheduler"]


@dataclass
class Offline:
    """A task's module, data, optimizer and schedule at one rate and seed, trained without a Trainer."""

    data: Any
    model: Any
    opt: torch.optim.Optimizer
    sched: Any
    clip: float | None  # the task's Trainer's gradient clipping
    params: list[torch.Tensor]  # the trainable ones
    val: list[Any]  # the first 8 validation batches


def offline(task: str, lr: float, seed: int) -> Offline:
    """The task at ``lr`` and ``seed`` as its Trainer would build it, for the loops of the offline studies."""
    with tempfile.TemporaryDirectory() as workdir:
        cfg = compose_run(task, "default", seed, [f"model.lr={lr}"], workdir)
    torch.manual_seed(seed)
    data, model = instantiate(cfg.data), instantiate(cfg.model)
    data.setup("fit")
    model.log = model.log_dict = lambda *a, **k: None  # no Trainer: nothing to log to
    opt, sched = _optimizer(model.configure_optimizers())
    params = [p for p in model.parameters() if p.requires_grad]
    val = list(itertools.islice(iter(data.val_dataloader()), 8))
    return Offline(data, model, opt, sched, cfg.trainer.get("gradient_clip_val"), params, val)


def study(task: str, lr: float, forks: list[int], after: list[int], span: int, seed: int) -> dict[str, Any]:
    o = offline(task, lr, seed)
    model, opt, sched, clip, params, val = o.model, o.opt, o.sched, o.clip, o.params, o.val
    stream = _batches(o.data)
    probe = [next(_batches(o.data))]
    rows, done = [], 0
    for fork in forks:
        _train(model, opt, sched, [next(stream) for _ in range(fork - span - done)], clip)
        start = torch._foreach_mul(params, 1.0)
        _train(model, opt, sched, [next(stream) for _ in range(span)], clip)
        done = fork
        mean = torch._foreach_sub([p.detach() for p in params], start)
        torch._foreach_div_(mean, span)
        saved = copy.deepcopy((model.state_dict(), opt.state_dict(), sched.state_dict()))
        ahead = [next(stream) for _ in range(max(after))]
        for k in MULTIPLES:
            model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
            sched.load_state_dict(saved[2])
            with torch.no_grad():
                torch._foreach_add_(params, mean, alpha=float(k))
            row = {"fork": fork, "k": k, "probe_now": _loss(model, probe), "val_now": _loss(model, val)}
            trained = 0
            for n in after:
                _train(model, opt, sched, ahead[trained:n], clip)
                trained, row[f"val_after_{n}"] = n, _loss(model, val)
            rows.append(row)
            print(row, flush=True)
        model.load_state_dict(saved[0])
        opt.load_state_dict(saved[1])
        sched.load_state_dict(saved[2])
    return {"task": task, "lr": lr, "seed": seed, "span": span, "after": after, "rows": rows}


def to_markdown(result: dict[str, Any]) -> str:
    after = result["after"]
    head = f"### {result['task']}, lr {result['lr']:g}, seed {result['seed']}, mean update of {result['span']} steps"
    lines = [head, "", "Each loss over the same fork's `k = 0` (below 1: the step helped).", ""]
    lines.append("| fork | k | probe at once | val at once | " + " | ".join(f"val {n} steps on" for n in after) + " |")
    lines.append("|---" * (4 + len(after)) + "|")
    base = {r["fork"]: r for r in result["rows"] if r["k"] == 0}
    for r in result["rows"]:
        b = base[r["fork"]]
        cells = [r[key] / b[key] for key in ("probe_now", "val_now", *(f"val_after_{n}" for n in after))]
        lines.append(f"| {r['fork']} | {r['k']} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="char_gpt")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--forks", type=int, nargs="+", default=[300, 600])
    parser.add_argument("--after", type=int, nargs="+", default=[25, 100])
    parser.add_argument("--span", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = study(args.task, args.lr, sorted(args.forks), sorted(args.after), args.span, args.seed)
    name = f"{args.task}_lr{args.lr:g}_seed{args.seed}"
    OUT.mkdir(parents=True, exist_ok=True)
    write_atomic(OUT / f"{name}.json", json.dumps(result, indent=1))
    text = to_markdown(result)
    write_atomic(OUT / f"{name}.md", text)
    print(text)


if __name__ == "__main__":
    main()
