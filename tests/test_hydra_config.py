"""The shipped Hydra config builds the same callbacks as ``hybrid_callbacks()``."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lightning_hybrid import HybridScheduler, hybrid_callbacks

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _config(overrides=()):
    with initialize_config_dir(config_dir=str(CONFIGS / "hybrid"), version_base="1.3"):
        return compose(config_name="default", overrides=list(overrides))


def test_default_config_matches_the_python_defaults():
    callbacks = instantiate(_config())
    scheduler = next(cb for cb in callbacks if isinstance(cb, HybridScheduler))
    reference = next(cb for cb in hybrid_callbacks() if isinstance(cb, HybridScheduler))
    assert scheduler.config == reference.config
    assert [type(cb) for cb in callbacks] == [type(cb) for cb in hybrid_callbacks()]


def test_overrides_reach_the_callbacks():
    callbacks = instantiate(_config(["max_predict_steps=20", "+z_threshold=6.0"]))
    scheduler = next(cb for cb in callbacks if isinstance(cb, HybridScheduler))
    assert scheduler.config.max_predict_steps == 20
    assert next(cb for cb in callbacks if type(cb).__name__ == "DivergenceMonitor").z_threshold == 6.0
