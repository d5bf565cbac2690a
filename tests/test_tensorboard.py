"""TensorBoard: each mode's scalars and custom-scalars layout, and the progress bar, read back from real runs: the
default rule's "Outer jumps" and the per-step mode's "Phase curves"."""

import math
import re

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from lightning_hybrid import HybridPredictStrategy, HybridProgressBar, Phase, hybrid_callbacks
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.tensorboard import LAYOUTS
from tests.helpers import FAST, RULE_PHASES, MemoryLogger, RegressionModel, hybrid_trainer, loader, scheduler_of

STEPS = 30
PHASE_CURVES = LAYOUTS["per-step"]
# the default rule on short cycles, with jumps large enough that the verdict undoes some and keeps others
JUMPS = {**RULE_PHASES, "predictor": "outer", "verify_window": 3, "verify_resolution": 0.5, "outer_lr": 1.6}
JUMP_STEPS = 90
PER_STEP_TERMS = (
    "backward skipped",
    "segment",
    "predict",
    "correct",
    "backed off",
    "confidence",
    "horizon",
    "rollback",
)


class _RecordingBar(HybridProgressBar):
    """What the bar would show at each step's end (listed after the plugin), and the plugin's counts at each of its
    decisions."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: dict[int, dict] = {}
        self.decided: dict[int, dict[str, float]] = {}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)
        self.shown[trainer.global_step] = self.get_metrics(trainer, pl_module)
        scheduler = find_scheduler(trainer)
        if scheduler is not None and scheduler.engine.decided:
            self.decided[trainer.global_step] = scheduler.engine.family.progress()

    def counts_shown(self) -> dict[int, dict[str, float]]:
        """The plugin's counts in the bar at each step, and what its last decision up to that step counted."""
        last: dict[str, float] = {}
        expected = {}
        for step in sorted(self.shown):
            last = self.decided.get(step, last)
            expected[step] = {k: torch.tensor(v).item() for k, v in last.items()}  # logged as float32 tensors
        shown = {step: {k: v for k, v in s.items() if k in expected[step]} for step, s in self.shown.items()}
        return shown, expected


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    trainer, _ = hybrid_trainer(max_steps=STEPS, logger=TensorBoardLogger(tmp_path_factory.mktemp("tb")))
    trainer.fit(RegressionModel(), loader())
    acc = EventAccumulator(trainer.log_dir)
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def jumps(tmp_path_factory):
    bar = _RecordingBar()
    trainer = L.Trainer(
        max_steps=JUMP_STEPS,
        strategy=HybridPredictStrategy(),
        accelerator="cpu",
        callbacks=[*hybrid_callbacks(**JUMPS), bar],
        logger=TensorBoardLogger(tmp_path_factory.mktemp("tb")),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(RegressionModel(), loader())
    acc = EventAccumulator(trainer.log_dir)
    acc.Reload()
    return acc, scheduler_of(trainer), bar


def _matches(pattern: str, tags: set[str]) -> set[str]:
    return {t for t in tags if re.search(pattern, t)}


def _layout(acc: EventAccumulator) -> layout_pb2.Layout:
    (event,) = acc.Tensors("custom_scalars__config__")  # written once per run
    return layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])


def test_the_default_rule_writes_its_own_layout_and_every_chart_has_data(jumps):
    events, scheduler, _ = jumps
    layout = _layout(events)
    assert [c.title for c in layout.category] == ["Outer jumps"]
    charts = {chart.title: chart for chart in layout.category[0].chart}
    assert set(charts) == set(LAYOUTS["jumps"]["Outer jumps"])
    tags = set(events.Tags()["scalars"])
    for title, chart in charts.items():  # every chart draws at least one curve, each pattern names one tag
        patterns = list(chart.multiline.tag)
        assert any(_matches(p, tags) for p in patterns), title
        assert all(len(_matches(p, tags)) <= 1 for p in patterns), title
    assert scheduler.counters.jumps_kept and scheduler.counters.jumps_rejected, "both verdicts must occur"


def test_the_default_rule_writes_no_per_step_scalar(jumps):
    tags = set(jumps[0].Tags()["scalars"])
    per_step = {t for _, series in PHASE_CURVES["Phase curves"].values() for p in series for t in _matches(p, tags)}
    assert per_step <= {"hybrid/loss", "hybrid/phase"}
    assert not {"hybrid/uncertainty", "hybrid/correction_magnitude", "hybrid/prediction_error"} & tags


def test_the_jump_counts_last_values_are_the_summarys(jumps):
    events, scheduler, _ = jumps
    summary = scheduler.summary()
    for name in ("jumps_made", "jumps_kept", "jumps_undone", "momentum_restarts", "blind_cycles"):
        assert events.Scalars(f"hybrid/{name}")[-1].value == summary[name], name
    assert summary["jumps_made"] == summary["jumps_kept"] + summary["jumps_undone"]


def test_the_verdict_and_jump_scalars_are_what_the_rule_decided(jumps):
    """Each verdict's two windows and margin: a jump undone by the verdict had its window after above the window
    before by more than the margin, a kept one did not; the relative size of a jump is positive; the cycle's margin
    stands against the limit the rule was given."""
    events = jumps[0]
    value = lambda tag: {e.step: e.value for e in events.Scalars(f"hybrid/{tag}") if math.isfinite(e.value)}  # noqa: E731
    before, after, margin, undone = (
        value(t) for t in ("verdict_before", "verdict_after", "verdict_margin", "jumps_undone")
    )
    verdicts = [s for s in sorted(before) if (before[s], after[s]) != (before.get(s - 1), after.get(s - 1))]
    kept = [s for s in verdicts if undone[s] == undone[s - 1]]
    rejected = [s for s in verdicts if undone[s] > undone[s - 1]]
    assert kept and rejected
    assert all(after[s] > before[s] + margin[s] for s in rejected)
    assert all(after[s] <= before[s] + margin[s] for s in kept)
    assert all(v > 0 for v in value("jump_size").values())
    assert set(value("verify_resolution").values()) == {0.5}


def test_the_progress_bar_shows_the_jumps_made_and_kept_and_the_text_speaks_the_default_rule(jumps):
    _, scheduler, bar = jumps
    c = scheduler.counters
    shown, expected = bar.counts_shown()
    assert shown == expected and set(expected[JUMP_STEPS]) == {"jumps", "kept"}  # as of each cycle's end
    assert 1 <= expected[JUMP_STEPS]["kept"] < expected[JUMP_STEPS]["jumps"] <= c.jumps_made
    assert "skipped" not in bar.shown[JUMP_STEPS]
    text = scheduler.report().lower()
    assert f"{c.jumps_made} jumps made, {c.jumps_kept} kept, {c.jumps_rejected} undone" in text
    assert not [term for term in PER_STEP_TERMS if term in text]
    summary = scheduler.summary()
    per_step = (
        "skipped_pct",
        "backward_skipped",
        "segment",
        "predict",
        "correct",
        "backed_off",
        "confidence",
        "rollback",
    )
    assert summary["mode"] == "jumps" and not [k for k in summary if any(t in k for t in per_step) and k != "predictor"]
    assert set(summary["steps_by_phase"]) == {"warmup", "full"}
    settings = summary["settings"]
    assert {k: settings[k] for k in ("outer_lr", "verify_window", "verify_resolution")} == {
        "outer_lr": 1.6,
        "verify_window": 3,
        "verify_resolution": 0.5,
    }
    assert {"outer_momentum", "keep_norms", "restart"} <= set(settings)
    assert not {"max_predict_steps", "confidence_threshold", "max_correction_factor", "arms"} & set(settings)


def test_phase_curves_layout_is_written_once_with_every_chart(events):
    layout = _layout(events)
    assert [c.title for c in layout.category] == ["Phase curves"]
    charts = {chart.title: chart for chart in layout.category[0].chart}
    assert set(charts) == set(PHASE_CURVES["Phase curves"])
    band = charts["predicted loss and its band"].margin.series[0]
    assert (band.value, band.lower, band.upper) == (
        "hybrid/loss_predicted",
        "hybrid/loss_predicted_lower",
        "hybrid/loss_predicted_upper",
    )


def test_every_curve_of_the_layout_has_data(events):
    """Multiline tags are anchored regular expressions (TensorBoard matches them); each names exactly one tag."""
    tags = set(events.Tags()["scalars"])
    for kind, series in PHASE_CURVES["Phase curves"].values():
        for pattern in series:
            matches = {t for t in tags if re.search(pattern, t)} if kind == "Multiline" else {pattern} & tags
            assert len(matches) == 1, (kind, pattern, matches)


@pytest.mark.parametrize(
    "tag", ["hybrid/phase", "hybrid/confidence", "hybrid/horizon", "hybrid/rollbacks", "hybrid/backward_skipped_pct"]
)
def test_per_step_curves_have_one_value_per_step(events, tag):
    assert [e.step for e in events.Scalars(tag)] == list(range(STEPS))  # the module's own steps


def test_the_band_surrounds_the_prediction_on_predicted_steps(events):
    predicted = {e.step for e in events.Scalars("hybrid/phase") if e.value == Phase.PREDICT}
    assert predicted, "the FAST settings must predict"
    value, lower, upper = (
        {e.step: e.value for e in events.Scalars(f"hybrid/{tag}") if math.isfinite(e.value)}
        for tag in ("loss_predicted", "loss_predicted_lower", "loss_predicted_upper")
    )
    assert set(lower) == set(upper) == set(value) >= predicted  # the margin chart needs the same steps for all three
    assert all(lower[s] < value[s] < upper[s] for s in predicted)
    assert all(lower[s] == value[s] == upper[s] for s in set(value) - predicted)  # no bound on one-step predictions


def test_progress_bar_shows_the_share_of_backward_passes_skipped():
    bar, logger = _RecordingBar(), MemoryLogger()
    trainer = L.Trainer(
        max_steps=STEPS,
        strategy=HybridPredictStrategy(),
        accelerator="cpu",
        callbacks=[*hybrid_callbacks(**FAST), bar],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(RegressionModel(), loader())
    shown, expected = bar.counts_shown()
    assert shown == expected and expected[STEPS]["skipped"] > 0  # the share skipped as of each decision


def test_progress_bar_without_the_hybrid_callbacks_is_the_plain_bar():
    bar = _RecordingBar()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", callbacks=[bar], logger=False, enable_checkpointing=False)
    trainer.fit(RegressionModel(), loader())
    assert not {"jumps", "kept", "averaged", "skipped"} & set(bar.shown[3])


@pytest.mark.parametrize("version", ["hybrid", "plain"])
def test_progress_bar_shows_a_string_version_whole(tmp_path, version):
    bar = _RecordingBar()
    logger = TensorBoardLogger(tmp_path, version=version)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", callbacks=[bar], logger=logger, enable_checkpointing=False)
    trainer.fit(RegressionModel(), loader())
    assert bar.shown[2]["v_num"] == version  # Lightning's own bar shows "brid" and "lain"


def test_every_predicted_loss_has_its_band_at_the_same_step(events):
    """TensorBoard's margin chart refuses to draw when the value, lower and upper tags' steps differ."""
    steps = {
        tag: [e.step for e in events.Scalars(tag)]
        for tag in PHASE_CURVES["Phase curves"]["predicted loss and its band"][1]
    }
    value, lower, upper = steps.values()
    assert value and value == lower == upper


def test_hybrid_scalars_follow_the_trainers_logging_cadence(tmp_path):
    """``hybrid/*`` scalars are written on the steps where Lightning writes the module's own ``self.log`` values
    (``log_every_n_steps``), not on every step."""

    class Logged(RegressionModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss)
            return loss

    trainer, _ = hybrid_trainer(max_steps=23, log_every_n_steps=5, logger=TensorBoardLogger(tmp_path))
    trainer.fit(Logged(), loader())
    acc = EventAccumulator(trainer.log_dir)
    acc.Reload()
    own = [e.step for e in acc.Scalars("train_loss")]
    assert own == [4, 9, 14, 19]  # Lightning's logger steps (`_batches_that_stepped`): every 5th batch
    assert [e.step for e in acc.Scalars("hybrid/phase")] == own  # the same batches, at the same steps


def test_a_checkpoint_callback_monitors_a_hybrid_scalar_as_a_self_log_value(tmp_path):
    """The scalars are in ``trainer.callback_metrics``, as the module's ``self.log`` values are: a
    ``ModelCheckpoint`` monitoring ``hybrid/loss`` keeps the step whose logged value was lowest."""
    keep = ModelCheckpoint(tmp_path, "{step}", monitor="hybrid/loss", save_top_k=1, every_n_train_steps=1)
    hybrid = hybrid_callbacks(**JUMPS)
    trainer, logger = hybrid_trainer(40, hybrid=hybrid, extra_callbacks=[keep], enable_checkpointing=True)
    trainer.fit(RegressionModel(), loader())
    logged = logger.series("hybrid/loss")  # Lightning's logger steps: the batch's global step less one
    best = min(logged, key=logged.get)
    assert keep.best_model_path.endswith(f"step={best + 1}.ckpt")
    assert keep.best_model_score.item() == pytest.approx(logged[best], rel=1e-6)
    made = trainer.callback_metrics["hybrid/jumps_made"].item()
    assert made == scheduler_of(trainer).summary()["jumps_made"] == logger.series("hybrid/jumps_made")[39] > 0


def test_the_readme_picture_draws_the_default_layout_one_colour_a_series(jumps, tmp_path):
    """The README's picture: the default rule's Custom Scalars layout drawn from this run's event files, one colour
    for each series of a chart (TensorBoard's own page colours a chart's series by run, all alike, and tells them
    apart by marker only). ``HYBRID_PICTURE=docs/tensorboard.png`` writes it there."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc, _, _ = jumps
    charts = LAYOUTS["jumps"]["Outer jumps"]
    figure, axes = plt.subplots(4, 2, figsize=(10, 11))
    for axis, (title, (_, patterns)) in zip(axes.flat, charts.items(), strict=True):
        for colour, pattern in enumerate(patterns):
            tag = pattern.strip("^$")
            points = [(e.step, e.value) for e in acc.Scalars(tag) if math.isfinite(e.value)]
            axis.plot(*zip(*points), color=f"C{colour}", label=tag.removeprefix("hybrid/"), linewidth=1.2)
        axis.set_title(title, fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("TensorBoard's Custom Scalars layout of the default rule, a short run (step on every x axis)")
    figure.tight_layout()
    path = os.environ.get("HYBRID_PICTURE") or tmp_path / "layout.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    for axis in figure.axes:
        colours = [line.get_color() for line in axis.get_lines()]
        assert colours and len(set(colours)) == len(colours), axis.get_title()
