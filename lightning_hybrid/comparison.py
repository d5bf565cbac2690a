"""What ``mode=compare`` reports of a plain and a hybrid run with the same seed: the table (led by when each run first
reached plain's final validation loss, with the steps it was validated at, which bound what it can show) and the
plot of both validation curves, against steps and against training seconds."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# the mode's own counts in the table, from the run's summary, by mode
COUNTS = {
    "jumps": ("jumps_made", "jumps_kept", "jumps_undone"),
    "per-step": ("backward_skipped_pct", "segments_started", "rollbacks"),
}


@dataclass
class RunResult:
    """One fit, measured by :class:`~lightning_hybrid.meter.RunMeter`."""

    label: str
    val_loss: float | None
    train_seconds: float
    train_cpu_seconds: float
    backward_passes: int
    steps: int
    mode: str | None = None  # the hybrid mode that ran (``jumps``, ``per-step``); None for plain Lightning
    counts: dict[str, float] = field(default_factory=dict)  # the mode's own counts (``COUNTS``)
    validations: list[tuple[int, float, float]] = field(default_factory=list)  # (step, training s, loss) in fit
    resumed_from: str | None = None  # the checkpoint the run went on from
    reached_plain_at: tuple[int, float] | None = None  # step and training seconds, first at plain's final loss
    load: tuple[float, float] | None = None  # the machine's 1-minute load average as the fit started and ended


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _reached(result: RunResult, index: int, fmt: str) -> str:
    return "never" if result.reached_plain_at is None else format(result.reached_plain_at[index], fmt)


def _steps(plain: RunResult, hybrid: RunResult) -> list[int]:
    return sorted({s for s, _, _ in plain.validations} | {s for s, _, _ in hybrid.validations})


def validated_steps(plain: RunResult, hybrid: RunResult) -> str:
    """The steps both runs were validated at: a run is known to have reached a loss only at a validation."""
    steps = _steps(plain, hybrid)
    return f"validated at steps {', '.join(map(str, steps))}" if steps else "validated only after fit"


def compared(ratio: float, fewer: str, more: str, same: str) -> str:
    """``1.150x fewer steps`` where the hybrid run needed less (``ratio``: plain's over hybrid's), ``1.150x more
    steps`` where it needed more, ``same`` where the two were equal."""
    if ratio == 1:
        return same
    return f"{ratio:.3f}x {fewer}" if ratio > 1 else f"{1 / ratio:.3f}x {more}"


def _at_least(plain: RunResult, hybrid: RunResult) -> bool:
    """Whether the hybrid run was first seen at plain's loss at the validation just before plain's: then it may
    have got there anywhere after the validation before that, and the gain is a lower bound."""
    steps = _steps(plain, hybrid)
    if plain.reached_plain_at is None or hybrid.reached_plain_at is None:
        return False
    p, h = plain.reached_plain_at[0], hybrid.reached_plain_at[0]
    return h in steps and p in steps and steps.index(p) - steps.index(h) == 1


def _load(plain: RunResult, hybrid: RunResult) -> str | None:
    """What the machine's load did while the two fits ran, where it rose by more than one busy core."""
    if plain.load is None or hybrid.load is None:
        return None
    start, end = min(plain.load[0], hybrid.load[0]), max(plain.load[1], hybrid.load[1], plain.load[0], hybrid.load[0])
    if end - start <= 1.0:
        return None
    return (
        f"the machine's load (1-minute average) rose from {start:.1f} to {end:.1f} during the runs: wall times "
        "met different loads; compare CPU times, or rerun with one torch thread on an idle machine"
    )


def comparison_table(plain: RunResult, hybrid: RunResult) -> str:
    """Side-by-side table, led by what decides a speedup: when each run first reached plain's final validation loss
    (the benchmark harness measures it over seeds); then the loss at equal steps and the costs. Every time is the
    run's training time in seconds, validation excluded (``RunMeter``), as wall and as this process's CPU time."""
    rows = [
        ("first at plain's final loss: step", _reached(plain, 0, "d"), _reached(hybrid, 0, "d")),
        ("  and training time (seconds)", _reached(plain, 1, ".2f"), _reached(hybrid, 1, ".2f")),
        ("val loss at equal steps", _num(plain.val_loss, ".4f"), _num(hybrid.val_loss, ".4f")),
        ("steps", str(plain.steps), str(hybrid.steps)),
        ("training time, wall (seconds)", _num(plain.train_seconds, ".2f"), _num(hybrid.train_seconds, ".2f")),
        ("training time, CPU (seconds)", _num(plain.train_cpu_seconds, ".2f"), _num(hybrid.train_cpu_seconds, ".2f")),
        ("backward passes", str(plain.backward_passes), str(hybrid.backward_passes)),
    ]
    rows += [(name.replace("_", " "), "-", f"{value:g}") for name, value in hybrid.counts.items()]
    lines = [f"{'':34s}{'plain':>12s}{'hybrid':>12s}"] + [f"{a:34s}{b:>12s}{c:>12s}" for a, b, c in rows]
    if plain.reached_plain_at is not None and hybrid.reached_plain_at is not None:
        steps = compared(
            plain.reached_plain_at[0] / hybrid.reached_plain_at[0], "fewer steps", "more steps", "as many steps"
        )
        wall = plain.reached_plain_at[1] / max(hybrid.reached_plain_at[1], 1e-9)
        bound = "at least " if _at_least(plain, hybrid) else ""
        faster = compared(wall, "faster", "slower", "as fast")
        lines.append(f"to plain's final val loss, the hybrid run took {bound}{steps} and was {faster} in wall time")
        if bound:
            lines.append(
                "  (at least: it was first seen there at the validation before plain's; it may have been earlier)"
            )
    else:
        lines.append("to plain's final val loss: the hybrid run never reached it")
    if plain.val_loss is not None and hybrid.val_loss is not None:
        lines.append(
            f"val loss at equal steps, hybrid / plain: {hybrid.val_loss / plain.val_loss:.4f} (<1: hybrid lower)"
        )
    lines.append(validated_steps(plain, hybrid))
    load = _load(plain, hybrid)
    if load is not None:
        lines.append(load)
    lines.append("(one seed: the benchmark harness measures over seeds, docs/performance.md)")
    return "\n".join(lines)


def plot_comparison(plain: RunResult, hybrid: RunResult, path: Path) -> Path | None:
    """Both validation curves against steps and against training seconds, with plain's final loss and the point
    where the hybrid run first reached it; written to ``path``. ``None`` (and said) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("compare: no plot without matplotlib (pip install 'lightning-hybrid[plot]')")
        return None
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, index, label in ((axes[0], 0, "step"), (axes[1], 1, "training time, wall (s)")):
        for result, style in ((plain, "-o"), (hybrid, "-s")):
            xs = [v[index] for v in result.validations]
            axis.plot(xs, [v[2] for v in result.validations], style, markersize=3, label=result.label)
        if plain.val_loss is not None:
            axis.axhline(plain.val_loss, color="grey", linestyle="--", linewidth=0.8, label="plain's final loss")
        if hybrid.reached_plain_at is not None:
            x = hybrid.reached_plain_at[index]
            axis.axvline(x, color="tab:green", linestyle=":", label=f"hybrid first at it ({x:g})")
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    figure.suptitle("mode=compare: plain Lightning and hybrid, same seed (validations inside fit)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
