"""LightningCLI users adopt the plugin from their config file: the README's YAML, run as written."""

import json
import re
from pathlib import Path

import pytest

from lightning_hybrid import HorizonBandit, HybridPredictStrategy

pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse (a test dependency)")
from lightning.pytorch.cli import LightningCLI

from tests.app_models import UserData, UserRegression
from tests.helpers import scheduler_of

ROOT = Path(__file__).resolve().parents[1]


def readme_yaml() -> str:
    section = (ROOT / "README.md").read_text().split("## LightningCLI", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_readme_yaml_trains_an_unchanged_module_with_the_plugin(tmp_path):
    config = tmp_path / "my_config.yaml"  # LightningCLI saves the resolved config.yaml into the run folder
    config.write_text(readme_yaml())
    cli = LightningCLI(
        UserRegression,
        UserData,
        args=[
            "fit",
            "--config", str(config),
            "--trainer.max_steps=12",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )  # fmt: skip
    trainer = cli.trainer
    assert isinstance(trainer.strategy, HybridPredictStrategy)
    scheduler = scheduler_of(trainer)
    assert scheduler.config.warmup_steps == 100 and scheduler.config.predict_lr_fraction == 0.4
    assert sum(isinstance(cb, HorizonBandit) for cb in trainer.callbacks) == 1
    summary = json.loads((tmp_path / "hybrid_summary.json").read_text())
    assert summary["steps_total"] == 12 and summary["predictor"] == "linear"


def test_a_misspelt_scheduler_setting_in_the_yaml_is_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(readme_yaml().replace("warmup_steps", "warmup_stepz"))
    with pytest.raises((SystemExit, TypeError, ValueError)):
        LightningCLI(UserRegression, UserData, args=["fit", "--config", str(config)], run=False)
