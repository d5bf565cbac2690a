"""With prediction off (or never confident enough), hybrid training is plain Lightning training, bit for bit."""

import lightning as L
import pytest
import torch

from lightning_hybrid import HybridPredictStrategy, hybrid_callbacks
from tests.helpers import RegressionModel, flat_params, loader


def _fit(hybrid_settings, **model_kwargs):
    model = RegressionModel(scheduler=True, **model_kwargs)
    trainer = L.Trainer(
        max_steps=50,
        strategy=HybridPredictStrategy() if hybrid_settings is not None else "auto",
        callbacks=hybrid_callbacks(**hybrid_settings) if hybrid_settings is not None else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, loader(), loader(64))
    return flat_params(model), trainer


@pytest.mark.parametrize(
    "settings",
    [
        {"warmup_steps": 5, "enable_prediction": False},
        {"warmup_steps": 5, "full_steps": 5, "confidence_threshold": 1.0, "predictor": "linear"},  # never confident
    ],
    ids=["prediction-off", "never-confident"],
)
@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_without_predicted_steps_training_equals_plain_lightning(settings, automatic):
    plain, _ = _fit(None, automatic=automatic)
    hybrid, trainer = _fit(settings, automatic=automatic)
    assert torch.equal(plain, hybrid)
    summary = next(cb for cb in trainer.callbacks if hasattr(cb, "summary")).summary()
    assert summary["steps_by_phase"].get("predict", 0) == 0
    assert summary["backward_passes"] == 50
