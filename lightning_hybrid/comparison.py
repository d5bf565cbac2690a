"""What ``mode=compare`` reports of a plain and a hybrid run with the same seed: the table (led by when each run first
reached plain's final validation loss, with the steps it was validated at, which bound what it can show) and the
plot of both validation curves, against steps and against training seconds."""

from __future__ import annotations

import logging
import textwrap
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
    # (step, training wall s, training CPU s, loss) at each validation in fit
    validations: list[tuple[int, float, float, float]] = field(default_factory=list)
    resumed_from: str | None = None  # the checkpoint the run went on from
    reached_plain_at: tuple[int, float, float] | None = None  # step, wall and CPU seconds, first at plain's final loss
    load: tuple[float, float] | None = None  # the machine's 1-minute load average as the fit started and ended
    val_seconds: float = 0.0  # wall seconds of the validations inside fit
    val_every: int | None = None  # steps between them (``val_check_interval``), where it counts steps
    val_batches: int | None = None  # batches each validation ran (what ran, not what was configured)
    val_count: int | None = None  # validations inside fit that ran

    @property
    def busy(self) -> float:
        """CPU seconds per wall second of training: steady while the run has the machine to itself, lower where
        another job took its cores."""
        return self.train_cpu_seconds / max(self.train_seconds, 1e-9)


LOAD_TOLERANCE = 0.1  # a run's CPU seconds per wall second more than 10% from the other's: the load changed


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _steps(plain: RunResult, hybrid: RunResult) -> list[int]:
    return sorted({v[0] for v in plain.validations} | {v[0] for v in hybrid.validations})


def validated_steps(plain: RunResult, hybrid: RunResult) -> str:
    """How often the runs were validated, and what it cost: a run is known to have reached a loss only there."""
    steps = _steps(plain, hybrid)
    if not steps:
        return "validated only after fit"
    every = f"every {plain.val_every} steps, " if plain.val_every else ""
    count = plain.val_count if plain.val_count is not None else len({v[0] for v in plain.validations})
    batches = "" if plain.val_batches is None else f" on {plain.val_batches} batch{'es' * (plain.val_batches != 1)}"
    cost = sum(r.val_seconds for r in (plain, hybrid)) / max(plain.train_seconds + hybrid.train_seconds, 1e-9)
    return (
        f"validated {every}{count} times inside each fit{batches}, at steps {', '.join(map(str, steps))}: "
        f"{cost:.0%} of training's wall time (trainer.val_check_interval, trainer.limit_val_batches)"
    )


def compared(plain: float, hybrid: float, fewer: str, more: str, same: str) -> str:
    """The hybrid run's cost against plain's, in percent of plain's: ``10% fewer steps``, ``25% more wall time``,
    or ``same`` where the two are equal to the percent."""
    change = round(100 * (hybrid / plain - 1)) if plain > 0 else 0
    if change == 0:
        return same
    return f"{-change}% {fewer}" if change < 0 else f"{change}% {more}"


def _at_least(plain: RunResult, hybrid: RunResult) -> bool:
    """Whether the hybrid run was first seen at plain's loss at the validation just before plain's: then it may
    have got there anywhere after the validation before that, and the gain is a lower bound."""
    steps = _steps(plain, hybrid)
    if plain.reached_plain_at is None or hybrid.reached_plain_at is None:
        return False
    p, h = plain.reached_plain_at[0], hybrid.reached_plain_at[0]
    return h in steps and p in steps and steps.index(p) - steps.index(h) == 1


def load_changed(plain: RunResult, hybrid: RunResult) -> str | None:
    """Why the two runs' wall times met different loads, or ``None``: their CPU seconds per wall second differ by
    more than ``LOAD_TOLERANCE``, or the machine's load average rose by more than one busy core."""
    if min(plain.busy, hybrid.busy) <= 0:
        return None
    why = []
    if max(plain.busy, hybrid.busy) / min(plain.busy, hybrid.busy) > 1 + LOAD_TOLERANCE:
        why.append(f"CPU seconds per wall second {plain.busy:.2f} in plain, {hybrid.busy:.2f} in hybrid")
    if plain.load is not None and hybrid.load is not None:
        start = min(plain.load[0], hybrid.load[0])
        end = max(plain.load[1], hybrid.load[1], plain.load[0], hybrid.load[0])
        if end - start > 1.0:
            why.append(f"the machine's load (1-minute average) rose from {start:.1f} to {end:.1f}")
    return "; ".join(why) or None


def _resolution(plain: RunResult, hybrid: RunResult) -> str | None:
    """Why "as many steps" may hide a gain: both runs were first seen at plain's loss at the same validation."""
    if plain.reached_plain_at[0] != hybrid.reached_plain_at[0]:
        return None
    every = f"every {plain.val_every} steps" if plain.val_every else "only where validated"
    return (
        f"  (as many steps to the validations' resolution: validated {every}, a gain under that cannot show; "
        "the loss at equal steps below can)"
    )


def headline(plain: RunResult, hybrid: RunResult) -> list[str]:
    """What the table leads to: the hybrid run's steps and time to plain's final validation loss, against plain's,
    and the validations' resolution where it limits the answer. Where the load changed during the runs, time says
    more of the machine than of the plugin (CPU time too: idle threads spin under load): then the line rests on
    steps and the loss at equal steps, with the times after them and the reason."""
    if plain.reached_plain_at is None or hybrid.reached_plain_at is None:
        return ["to plain's final val loss: the hybrid run never reached it"]
    (p_step, p_wall, p_cpu), (h_step, h_wall, h_cpu) = plain.reached_plain_at, hybrid.reached_plain_at
    bound = "at least " if _at_least(plain, hybrid) else ""
    steps = compared(p_step, h_step, "fewer steps", "more steps", "as many steps")
    wall = compared(p_wall, h_wall, "less wall time", "more wall time", "as much wall time")
    cpu = compared(p_cpu, h_cpu, "less CPU time", "more CPU time", "as much CPU time")
    lead = f"to plain's final val loss (step {p_step}), the hybrid run took {bound}{steps} (step {h_step})"
    changed = load_changed(plain, hybrid)
    if trained_alike(hybrid):
        return [
            f"the hybrid run made no {'jump' if hybrid.mode == 'jumps' else 'prediction'}: the two runs trained the "
            f"same way, so their difference in time ({wall} and {cpu}, the hybrid run second) is the machine's"
        ]
    if changed is None:
        lines = [f"{lead}, {wall} and {cpu} (plain ran first, the hybrid run second)"]
    else:
        loss = _loss_change(plain, hybrid)
        lines = [
            f"{lead}{f', and its loss at equal steps was {loss}' if loss else ''}; its {wall} and {cpu} met another "
            f"load ({changed}): compare steps and losses, or rerun with one torch thread (OMP_NUM_THREADS=1) on an "
            "idle machine"
        ]
    if bound:
        lines.append("  (at least: it was first seen there at the validation before plain's; it may have been earlier)")
    resolution = _resolution(plain, hybrid)
    return lines + ([resolution] if resolution else [])


MADE = {"jumps": "jumps_made", "per-step": "segments_started"}  # what a run of each mode does that plain does not


def trained_alike(hybrid: RunResult) -> bool:
    """Whether the hybrid run made no jump or prediction: it trained as plain does, step for step."""
    made = MADE.get(hybrid.mode or "")
    return made is not None and hybrid.counts.get(made, 0) == 0


def _loss_change(plain: RunResult, hybrid: RunResult) -> str | None:
    """The hybrid run's loss at equal steps against plain's: ``2.0% lower``, ``as low``."""
    if plain.val_loss is None or hybrid.val_loss is None or plain.val_loss <= 0:
        return None
    change = 100 * (hybrid.val_loss / plain.val_loss - 1)
    return "as low" if abs(change) < 0.05 else f"{abs(change):.1f}% {'lower' if change < 0 else 'higher'}"


FEWER, LESS = ("fewer", "more", "as many"), ("less", "more", "as much")  # compared()'s words, for counts and times


def _row(label: str, plain: float | None, hybrid: float | None, fmt: str, words: tuple[str, str, str]) -> tuple:
    """A table row: both runs' values and the hybrid run's against plain's (``20% fewer``)."""
    against = "" if plain is None or hybrid is None else compared(plain, hybrid, *words)
    return label, _num(plain, fmt), _num(hybrid, fmt), against


def comparison_table(plain: RunResult, hybrid: RunResult) -> str:
    """Side-by-side table, led by what decides a speedup: when each run first reached plain's final validation loss
    (the benchmark harness measures it over seeds); then the loss at equal steps and the whole fits' costs, each in
    a last column as the hybrid run's against plain's, in percent; then what the hybrid run did that plain does
    not, a count a row. Every time is training time in seconds, validation excluded (``RunMeter``), as wall and as
    this process's CPU time. Within 80 columns, as a terminal shows it."""
    reached = [r.reached_plain_at or (None, None, None) for r in (plain, hybrid)]
    rows = [
        _row("first at plain's final loss: step", reached[0][0], reached[1][0], "d", FEWER),
        _row("  its training time, wall (seconds)", reached[0][1], reached[1][1], ".2f", LESS),
        _row("  its training time, CPU (seconds)", reached[0][2], reached[1][2], ".2f", LESS),
        (
            f"val loss at equal steps (step {hybrid.steps})",
            _num(plain.val_loss, ".4f"),
            _num(hybrid.val_loss, ".4f"),
            _loss_change(plain, hybrid) or "",
        ),
        ("whole fit: steps", str(plain.steps), str(hybrid.steps), ""),
        _row("  training time, wall (seconds)", plain.train_seconds, hybrid.train_seconds, ".2f", LESS),
        _row("  training time, CPU (seconds)", plain.train_cpu_seconds, hybrid.train_cpu_seconds, ".2f", LESS),
        _row("  validation, wall (seconds)", plain.val_seconds, hybrid.val_seconds, ".2f", LESS),
        _row("  backward passes", plain.backward_passes, hybrid.backward_passes, "d", FEWER),
    ]
    rows += [(name.replace("_", " "), "-", f"{value:g}", "") for name, value in hybrid.counts.items()]
    lines = [f"{'':36s}{'plain':>9s}{'hybrid':>9s}  hybrid against plain"]
    lines += [f"{a:36s}{b:>9s}{c:>9s}  {d}".rstrip() for a, b, c, d in rows]
    notes = [*headline(plain, hybrid), validated_steps(plain, hybrid)]
    notes.append(
        "(one seed, one run each: times are noisy, two identical runs differed by up to 19% on an idle 2-core "
        "machine, benchmarks/results/footprint; the harness measures over seeds with a plain control)"
    )
    for note in notes:  # each wrapped to the table's width, its indent kept
        indent = " " * (len(note) - len(note.lstrip()))
        lines.append(textwrap.fill(note, 80, initial_indent="", subsequent_indent=indent + "  "))
    return "\n".join(lines)


def reached_label(x: float, index: int) -> str:
    """The plot's legend for where the hybrid run first reached plain's final loss, in steps or seconds."""
    return f"hybrid first at plain's final loss: {f'step {x}' if index == 0 else f'{x:.1f} s'}"


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
            axis.plot(xs, [v[3] for v in result.validations], style, markersize=3, label=result.label)
        if plain.val_loss is not None:
            axis.axhline(plain.val_loss, color="grey", linestyle="--", linewidth=0.8, label="plain's final loss")
        if hybrid.reached_plain_at is not None:
            x = hybrid.reached_plain_at[index]
            axis.axvline(x, color="tab:green", linestyle=":", label=reached_label(x, index))
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
