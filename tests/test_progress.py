"""The plugin's counts show in whatever progress bar the Trainer has, the rendered text read back: Lightning's TQDM
bar and ``RichProgressBar`` beside the plugin as one callback. They reach the bar through Lightning's own logging
(``self.log(..., prog_bar=True)``) at each of the plugin's decisions: nothing of the bar's is changed."""

from __future__ import annotations

import io
import pickle
import re

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from lightning_hybrid import HybridScheduler
from tests.helpers import DEFAULT_JUMPING, RULE_PHASES, RegressionModel, loader, scheduler_of


def _fit(bar: L.Callback, steps: int = 40, **settings) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        callbacks=[bar, HybridScheduler(**{**RULE_PHASES, **DEFAULT_JUMPING, **settings})],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(RegressionModel(scheduler=True), loader())
    return trainer


def _shown(trainer: L.Trainer) -> dict[str, float]:
    """What the plugin logged for the bar, as of its last decision (a cycle's end): the jumps made and kept."""
    shown = trainer.progress_bar_metrics
    made = scheduler_of(trainer).summary()["jumps_made"]
    assert 1 <= shown["kept"] <= shown["jumps"] <= made, (shown, made)  # a jump may follow the last cycle's end
    return shown


def test_lightnings_tqdm_bar_shows_the_jumps_made_and_kept(capsys):
    bar = TQDMProgressBar(refresh_rate=1)
    trainer = _fit(bar)
    shown, text = _shown(trainer), "".join(capsys.readouterr())
    assert f"jumps={shown['jumps']:.3f}, kept={shown['kept']:.3f}" in text, text[-600:]  # Lightning's float format
    assert "get_metrics" not in vars(bar)  # Lightning's own, and it still pickles
    pickle.dumps(bar)


def test_richs_bar_shows_the_jumps_made_and_kept():
    pytest.importorskip("rich")
    screen = io.StringIO()
    bar = RichProgressBar(console_kwargs={"file": screen, "force_terminal": True, "width": 200, "color_system": None})
    trainer = _fit(bar)
    shown, text = _shown(trainer), screen.getvalue()
    assert re.search(rf"jumps: {shown['jumps']:.3f} kept: {shown['kept']:.3f}", text), text[-600:]
    assert "get_metrics" not in vars(bar)


def test_primal_averaging_shows_the_steps_averaged():
    trainer = _fit(TQDMProgressBar(), predictor="gpa")
    assert 0 < trainer.progress_bar_metrics["averaged"] <= scheduler_of(trainer).summary()["averaged_steps"]
