"""Dynamics predictors, selectable by name."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.predictors.base import Plan, Predictor, UpdateStats
from lightning_hybrid.predictors.direction import DirectionPredictor
from lightning_hybrid.predictors.gpa import PrimalAveraging
from lightning_hybrid.predictors.learned import LearnedPredictor
from lightning_hybrid.predictors.linear import LinearPredictor
from lightning_hybrid.predictors.mlp import MLPPredictor
from lightning_hybrid.predictors.outer import OuterMomentum
from lightning_hybrid.predictors.rssm import RSSMPredictor
from lightning_hybrid.predictors.rules import TrajectoryRule
from lightning_hybrid.settings import check_choice

AnyPredictor = Predictor | TrajectoryRule
PREDICTORS: dict[str, type[AnyPredictor]] = {
    cls.name: cls for cls in (OuterMomentum, PrimalAveraging, LinearPredictor, MLPPredictor, RSSMPredictor)
}


def build_predictor(name: str, **kwargs: Any) -> AnyPredictor:
    """Instantiate the predictor registered as ``name`` with its settings."""
    check_choice("DynamicsPredictor", "predictor", name, PREDICTORS)
    return PREDICTORS[name](**kwargs)


__all__ = [
    "PREDICTORS",
    "AnyPredictor",
    "DirectionPredictor",
    "LearnedPredictor",
    "LinearPredictor",
    "MLPPredictor",
    "OuterMomentum",
    "Plan",
    "Predictor",
    "PrimalAveraging",
    "RSSMPredictor",
    "TrajectoryRule",
    "UpdateStats",
    "build_predictor",
]
