"""TensorBoard: the phase curves, their custom-scalars layout and the progress bar, read back from a real run."""

import re

import lightning as L
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from lightning_hybrid import HybridPredictStrategy, HybridProgressBar, Phase, hybrid_callbacks
from lightning_hybrid.tensorboard import PHASE_CURVES
from tests.helpers import FAST, MemoryLogger, RegressionModel, hybrid_trainer, loader, phases, scheduler_of

STEPS = 30


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    trainer, _ = hybrid_trainer(max_steps=STEPS, logger=TensorBoardLogger(tmp_path_factory.mktemp("tb")))
    trainer.fit(RegressionModel(), loader())
    acc = EventAccumulator(trainer.log_dir)
    acc.Reload()
    return acc


def _layout(acc: EventAccumulator) -> layout_pb2.Layout:
    (event,) = acc.Tensors("custom_scalars__config__")  # written once per run
    return layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])


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
    assert [e.step for e in events.Scalars(tag)] == list(range(1, STEPS + 1))


def test_the_band_surrounds_the_prediction_on_predicted_steps(events):
    predicted = {e.step for e in events.Scalars("hybrid/phase") if e.value == Phase.PREDICT}
    assert predicted, "the FAST settings must predict"
    value = {e.step: e.value for e in events.Scalars("hybrid/loss_predicted")}
    lower = {e.step: e.value for e in events.Scalars("hybrid/loss_predicted_lower")}
    upper = {e.step: e.value for e in events.Scalars("hybrid/loss_predicted_upper")}
    assert set(lower) == set(upper) == set(value) >= predicted  # the margin chart needs the same steps for all three
    assert all(lower[s] < value[s] < upper[s] for s in predicted)
    assert all(lower[s] == value[s] == upper[s] for s in set(value) - predicted)  # no bound on one-step predictions


class _RecordingBar(HybridProgressBar):
    def __init__(self) -> None:
        super().__init__()
        self.shown: dict[int, dict] = {}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)
        self.shown[trainer.global_step] = self.get_metrics(trainer, pl_module)


def test_progress_bar_shows_the_phase_and_backward_skipped():
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
    logged = phases(logger)
    # the bar shows the phase the scheduler is in after the step: the next step's phase
    assert [bar.shown[s]["phase"] for s in range(1, STEPS)] == [logged[s + 1].label for s in range(1, STEPS)]
    assert bar.shown[STEPS]["skipped"] == f"{scheduler_of(trainer).counters.backward_skipped_pct:.1f}%"
    assert bar.shown[STEPS]["skipped"] != "0.0%"


def test_progress_bar_without_the_hybrid_callbacks_is_the_plain_bar():
    bar = _RecordingBar()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", callbacks=[bar], logger=False, enable_checkpointing=False)
    trainer.fit(RegressionModel(), loader())
    assert "phase" not in bar.shown[3] and "skipped" not in bar.shown[3]


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
    assert [e.step for e in acc.Scalars("hybrid/phase")] == [s + 1 for s in own]  # after that batch's step
