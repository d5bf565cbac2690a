"""The harness's outputs for people: the Markdown table of every result in a folder, and one plot per task.

python -m benchmarks.report benchmarks/results/cpu      # print (and rewrite) that folder's table.md
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.curves import RISE_TOLERANCE
from benchmarks.harness import flag_overfitting, write_atomic

CLOCKS = {"cpu_s": "CPU time", "wall_s": "wall time", "backward": "backward passes"}


def median_over_seeds(values: list[float | None]) -> float | None:
    """The median over seeds, a seed that never reached the target (``None``) counting as slower than any that did:
    ``None`` only where half of them or more never did. Requiring every seed to reach it would judge plain against
    itself a miss wherever one seed's baseline ends on its curve's lowest point, as `rerun` did on LoRA at 3x."""
    missing = sum(v is None for v in values)
    if not values or 2 * missing >= len(values):
        return None
    return statistics.median([-math.inf] * missing + sorted(v for v in values if v is not None))


def seeds_cell(values: list[float | None], fmt: str = ".2f", suffix: str = "x") -> str:
    """A median over seeds with its range, and how many seeds never reached the target."""
    if not values:
        return "-"
    known = [v for v in values if v is not None]
    middle, missing = median_over_seeds(values), len(values) - len(known)
    if middle is None:
        return f"not reached in {missing} of {len(values)}"
    spread = f"{min(known):{fmt}}-{max(known):{fmt}}"
    return f"{middle:{fmt}}{suffix} ({spread}" + (f"; not reached in {missing} of {len(values)})" if missing else ")")


def _ratio(spread: dict[str, Any], seeds: int, overfitting: int = 0, unit: str = "") -> str:
    """A median ratio and its range over the seeds plain's final loss is a target in (``unit`` after it)."""
    over = f"; plain overfits in {overfitting} of {seeds} seeds" if overfitting else ""
    if overfitting == seeds:
        return f"none: plain overfits in {seeds} of {seeds} seeds"
    if spread["median"] is None:
        return f"not reached in {spread['missing']} of {seeds - overfitting} seeds{over}"
    return f"{spread['median']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f}){unit}{over}"


def _loss(spread: dict[str, Any], seeds: int) -> str:
    if spread["median"] is None:
        return f"n/a in {spread['missing']} of {seeds} seeds"
    return f"{spread['median']:.3f} ({spread['min']:.3f}-{spread['max']:.3f})"


def _speedup(result: dict[str, Any]) -> str:
    s, n = result["summary"], len(result["seeds"])
    over, unit = s.get("overfitting", 0), f" {CLOCKS[s['clock']]}"
    if s["speedup"]["median"] is not None or over == n:
        return _ratio(s["speedup"], n, over, unit)
    best = [seed["hybrid_best_loss"] / seed["target"] for seed in result["seeds"]]
    return f"{_ratio(s['speedup'], n, over)}; best val loss {min(best):.3f}-{max(best):.3f}x the target"


def table_row(result: dict[str, Any]) -> str:
    s, n = result["summary"], len(result["seeds"])
    cells = [
        result["task"],
        f"{result['length']} ({result['steps']} steps)",
        f"`{result['name']}`",
        str(n),
        _speedup(result),
        _ratio(s["backward_ratio"], n, s.get("overfitting", 0)),
        _loss(s["loss_ratio_equal_steps"], n),
        _loss(s["loss_ratio_equal_time"], n),
        f"{s['backward_skipped_pct']['median']:.1f}%",
        str(s["rollbacks"]),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| task | length | hybrid config | seeds | speedup to target | backward passes to target, plain/hybrid"
    " | val loss at equal steps, hybrid/plain | val loss at equal time, hybrid/plain | backward skipped"
    " | rollbacks |\n|---|---|---|---|---|---|---|---|---|---|"
)


def write_table(folder: Path) -> str:
    """Rewrite ``folder/table.md`` from every result JSON in it; return the table."""
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    results = [flag_overfitting(r) for r in results if "summary" in r]
    machines = sorted(
        {
            f"{r['machine'].get('cuda_device', r['machine']['processor'])}, "
            f"{r['machine']['torch_threads']} torch threads"
            for r in results
        }
    )
    lines = [HEADER, *map(table_row, results), "", "Machine: " + "; ".join(machines) + "."]
    lines.append(
        "Speedup = plain's time to its own final val loss / hybrid's time to the same loss (median and range over"
        " seeds; >1 is faster). Equal steps: at the plain run's last step; equal time: at the plain run's final"
        " training time. Validation time is excluded from every clock. Plain overfits where its last validation"
        f" loss is more than {RISE_TOLERANCE:.0%} above its lowest: its final loss is then no target, and that seed"
        " gives no time to target. Passes over each task's training data: `benchmarks/tasks.py`."
    )
    text = "\n".join(lines) + "\n"
    write_atomic(folder / "table.md", text)
    return text


def plot_task(result: dict[str, Any], path: Path) -> None:
    """Validation loss against the headline clock and against backward passes, every seed, Predict segments
    shaded (on the backward-pass axis a segment has no width, so it is a vertical line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clock = result["summary"]["clock"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, axis in zip(axes, (clock, "backward")):
        for i, seed in enumerate(result["seeds"]):
            for label, color in (("baseline", "C0"), ("hybrid", "C1")):
                points = seed[label]["points"]
                name = ("plain" if label == "baseline" else "hybrid") if i == 0 else None
                ax.plot(
                    [p[axis] for p in points],
                    [p["val_loss"] for p in points],
                    color=color,
                    alpha=0.8,
                    label=name,
                    marker=".",
                )
            for start, end in seed["hybrid"]["segments"]:
                if axis == "backward":
                    ax.axvline(start[axis], color="C1", alpha=0.4, lw=0.8)
                else:
                    ax.axvspan(start[axis], end[axis], color="C1", alpha=0.15, lw=0)
            ax.axhline(seed["target"], color="grey", ls=":", lw=0.8)
        ax.set_xlabel(CLOCKS[axis] + (" (s)" if axis != "backward" else ""))
    axes[0].set_ylabel("validation loss")
    axes[0].legend()
    fig.suptitle(f"{result['task']} ({result['length']}, `{result['name']}`): Predict segments shaded")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    print(write_table(Path(sys.argv[1])))
