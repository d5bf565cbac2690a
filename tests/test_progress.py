"""The phase and the jumps kept show in whatever progress bar the Trainer has, the rendered text read back: Lightning's
TQDM bar and ``RichProgressBar`` beside the plugin as one callback; the bar is the user's own again after the fit."""

from __future__ import annotations

import io
import pickle
import re

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from lightning_hybrid import HybridScheduler
from tests.helpers import DEFAULT_JUMPING, RULE_PHASES, RegressionModel, loader, scheduler_of


def _fit(bar: L.Callback, steps: int = 40) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        callbacks=[bar, HybridScheduler(**RULE_PHASES, **DEFAULT_JUMPING)],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(RegressionModel(scheduler=True), loader())
    return trainer


def test_lightnings_tqdm_bar_shows_the_phase_and_the_jumps_kept(capsys):
    bar = TQDMProgressBar(refresh_rate=1)
    trainer = _fit(bar)
    text = "".join(capsys.readouterr())
    made = scheduler_of(trainer).summary()["jumps_made"]
    assert made >= 1 and "phase=full" in text
    assert re.search(rf"jumps kept=\d/{made}", text), text[-600:]
    assert "get_metrics" not in vars(bar)  # its own again, and it still pickles
    pickle.dumps(bar)


def test_richs_bar_shows_the_phase_and_the_jumps_kept():
    pytest.importorskip("rich")
    screen = io.StringIO()
    bar = RichProgressBar(console_kwargs={"file": screen, "force_terminal": True, "width": 200, "color_system": None})
    trainer = _fit(bar)
    made = scheduler_of(trainer).summary()["jumps_made"]
    text = screen.getvalue()
    assert made >= 1 and "phase: full" in text
    assert re.search(rf"jumps kept: \d/{made}", text), text[-600:]
    assert "get_metrics" not in vars(bar)
