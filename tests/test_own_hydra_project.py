"""A Hydra project of the user's own, shaped like lightning-hydra-template (its ``train.py`` instantiating a dict of
callbacks and a Trainer from config, a ModelCheckpoint and an EarlyStopping among the callbacks), adopts the plugin
with the package's config group: one ``hydra.searchpath`` entry in its config and one override; a rule or a setting
is one more override. The project's configs are composed with the overrides its command line would get, and its
``train`` runs in this process."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_hybrid import HybridScheduler

PROJECT = {
    "configs/train.yaml": """
        defaults:
          - _self_
          - data: regression
          - model: regression
          - callbacks: default
          - trainer: default
        hydra:
          searchpath:
            - pkg://lightning_hybrid.hydra_configs  # the one line that makes the plugin's configs reachable
        paths:
          output_dir: ???
        """,
    "configs/data/regression.yaml": "_target_: tests.app_models.UserData\n",
    "configs/model/regression.yaml": "_target_: tests.app_models.UserRegression\n",
    "configs/callbacks/default.yaml": "defaults:\n  - model_checkpoint\n  - early_stopping\n  - _self_\n",
    "configs/callbacks/model_checkpoint.yaml": """
        model_checkpoint:
          _target_: lightning.pytorch.callbacks.ModelCheckpoint
          dirpath: ${paths.output_dir}/checkpoints
          monitor: val_loss
          save_last: true
        """,
    "configs/callbacks/early_stopping.yaml": """
        early_stopping:
          _target_: lightning.pytorch.callbacks.EarlyStopping
          monitor: val_loss
          patience: 100
        """,
    "configs/trainer/default.yaml": """
        _target_: lightning.pytorch.Trainer
        default_root_dir: ${paths.output_dir}
        accelerator: cpu
        devices: 1
        max_steps: 40
        val_check_interval: 8
        check_val_every_n_epoch: null
        logger: false
        enable_progress_bar: false
        enable_model_summary: false
        """,
    "train.py": """
        import hydra
        from omegaconf import DictConfig


        def instantiate_callbacks(callbacks_cfg: DictConfig) -> list:
            return [hydra.utils.instantiate(c) for c in (callbacks_cfg or {}).values() if "_target_" in c]


        def train(cfg: DictConfig):
            datamodule = hydra.utils.instantiate(cfg.data)
            model = hydra.utils.instantiate(cfg.model)
            trainer = hydra.utils.instantiate(cfg.trainer, callbacks=instantiate_callbacks(cfg.get("callbacks")))
            trainer.fit(model=model, datamodule=datamodule)
            return trainer


        @hydra.main(version_base="1.3", config_path="configs", config_name="train")
        def main(cfg: DictConfig) -> None:
            train(cfg)


        if __name__ == "__main__":
            main()
        """,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("my_project")
    for name, text in PROJECT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def _train(project: Path, out: Path, *overrides: str):
    """``python train.py <overrides>``, its config composed here and its ``train`` run in this process."""
    spec = importlib.util.spec_from_file_location("my_project_train", project / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with initialize_config_dir(config_dir=str(project / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={out}", *overrides])
    return module.train(cfg)


def _kinds(trainer) -> set[type]:
    return {type(cb) for cb in trainer.callbacks}


def test_plain_then_the_plugin_by_one_override_then_a_setting_and_gpa(project, tmp_path):
    plain = _train(project, tmp_path / "plain")
    assert {ModelCheckpoint, EarlyStopping} <= _kinds(plain) and HybridScheduler not in _kinds(plain)
    hybrid = _train(project, tmp_path / "hybrid", "callbacks=[default,hybrid]")
    scheduler = next(cb for cb in hybrid.callbacks if isinstance(cb, HybridScheduler))
    assert {ModelCheckpoint, EarlyStopping} <= _kinds(hybrid) and type(hybrid.strategy) is SingleDeviceStrategy
    assert scheduler.summary()["predictor"] == "outer" and scheduler.summary()["steps_total"] == 40
    assert (tmp_path / "hybrid" / "checkpoints" / "last.ckpt").is_file()
    tuned = _train(project, tmp_path / "tuned", "callbacks=[default,hybrid]", "+callbacks.hybrid.full_steps=10")
    assert next(cb for cb in tuned.callbacks if isinstance(cb, HybridScheduler)).config.full_steps == 10
    gpa = _train(project, tmp_path / "gpa", "callbacks=[default,hybrid]", "callbacks.hybrid.predictor=gpa")
    summary = next(cb for cb in gpa.callbacks if isinstance(cb, HybridScheduler)).summary()
    assert summary["predictor"] == "gpa" and json.dumps(summary)  # a whole run's summary, as written


def test_the_config_group_ships_in_the_package():
    """What ``pkg://lightning_hybrid.hydra_configs`` finds, in an installed wheel as in a checkout."""
    from importlib.resources import files

    shipped = files("lightning_hybrid.hydra_configs") / "callbacks" / "hybrid.yaml"
    assert "_target_: lightning_hybrid.HybridScheduler" in shipped.read_text()
