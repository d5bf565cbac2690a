"""The Hydra training app: ``lightning-hybrid-train`` or ``python -m lightning_hybrid.train``.

lightning-hybrid-train                                          # hybrid char GPT, TensorBoard logs under logs/
lightning-hybrid-train predictor=rssm hybrid.max_predict_steps=20 trainer.max_steps=500 data.batch_size=64
lightning-hybrid-train experiment=digits_cnn mode=compare       # plain vs hybrid, side by side
lightning-hybrid-train -m hybrid.confidence_threshold=0.5,0.7,0.9
lightning-hybrid-train model._target_=my_pkg.MyModule data._target_=my_pkg.MyData
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lightning_hybrid.runner import run
from lightning_hybrid.schema import register_configs


def config_dir() -> str:
    """The configs shipped inside the package (wheel installs), else the repository's ``configs/``."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return str(packaged if packaged.is_dir() else here.parent / "configs")


register_configs()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run(cfg)


if __name__ == "__main__":
    main()
