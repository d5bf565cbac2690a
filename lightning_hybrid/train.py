"""The Hydra training app: ``lightning-hybrid-train`` or ``python -m lightning_hybrid.train``.

lightning-hybrid-train                                          # hybrid char GPT, TensorBoard logs under logs/
lightning-hybrid-train predictor=rssm hybrid.max_predict_steps=20 trainer.max_steps=500 data.batch_size=64
lightning-hybrid-train experiment=digits_cnn mode=compare       # plain vs hybrid, side by side
lightning-hybrid-train -m hybrid.confidence_threshold=0.5,0.7,0.9
lightning-hybrid-train model._target_=my_pkg.MyModule data._target_=my_pkg.MyData
lightning-hybrid-train --config-dir my_configs experiment=mine  # your own groups beside the shipped ones

The configs ship inside the package as ``lightning_hybrid.configs`` (the checkout's ``configs/`` folder, which an
editable install reads in place), so a wheel install needs no checkout.
"""

from __future__ import annotations

import logging
import shutil
import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from lightning_hybrid.hydra_settings import CONFIG_MODULE, misplaced, read_by_its_mode, register_configs
from lightning_hybrid.runner import SettingError, run

HYDRAS_FILES = (".hydra", "train.log")  # what Hydra writes into a run's folder before the run starts

register_configs()


@hydra.main(version_base="1.3", config_path=f"pkg://{CONFIG_MODULE}", config_name="train")
def _app(cfg: DictConfig) -> float | None:
    _through_hydras_logging("lightning", "lightning.pytorch")
    _without_lightnings_asides()
    _dump_what_the_mode_reads(cfg)
    try:
        return run(cfg)
    except SettingError as err:
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode is not RunMode.RUN:  # a sweep's job: Hydra records the failure and the sweep goes on
            raise
        _remove_unused(Path(hydra_cfg.runtime.output_dir))
        sys.exit(f"lightning-hybrid-train: {err}")


def _dump_what_the_mode_reads(cfg: DictConfig) -> None:
    """Hydra's ``config.yaml`` of the run, with only the ``hybrid`` settings its mode reads
    (:func:`~lightning_hybrid.hydra_settings.read_by_its_mode`); a config whose predictor names no registered family
    stays whole."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.output_subdir is None:
        return
    try:
        trimmed = read_by_its_mode(cfg)
    except (ValueError, ImportError, AttributeError):
        return
    dumped = Path(hydra_cfg.runtime.output_dir) / hydra_cfg.output_subdir / "config.yaml"
    dumped.write_text(OmegaConf.to_yaml(trimmed))


def _remove_unused(folder: Path) -> None:
    """The folder Hydra made for a run that failed before training, if it holds nothing but Hydra's own files
    (``.hydra/``, ``train.log``); then each parent it leaves empty, up to the working directory."""
    if not folder.is_dir() or any(p.name not in HYDRAS_FILES for p in folder.iterdir()):
        return
    shutil.rmtree(folder)
    stop = Path.cwd().resolve()
    for parent in folder.resolve().parents:
        if parent == stop or not parent.is_relative_to(stop) or any(parent.iterdir()):
            break
        parent.rmdir()


def _without_lightnings_asides() -> None:
    """Leave out what Lightning prints that no setting of the app caused nor can change: the tip to install its
    cloud logger, at every Trainer's start, and the deprecation Lightning 2.6 meets in torch 2.13's pytree API."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_not_a_tip)  # once, however many runs
    warnings.filterwarnings("ignore", message=r".*`isinstance\(treespec, LeafSpec\)` is deprecated")


def _not_a_tip(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("💡 Tip:")


def _through_hydras_logging(*names: str) -> None:
    """Send Lightning's messages (the hybrid summary's among them) through the handlers Hydra set up, the console
    and the run's ``train.log``, once each: imported before any logging was configured, it added its own."""
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def main() -> float | None:
    """The console script: a hybrid setting given in the wrong group, or misspelt, is refused before Hydra composes
    the config, naming where it belongs or the closest names."""
    message = misplaced(sys.argv[1:])
    if message is not None:
        sys.exit(f"lightning-hybrid-train: {message}")
    return _app()


if __name__ == "__main__":
    main()
