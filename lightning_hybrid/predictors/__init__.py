"""Dynamics predictors, selectable by name."""

from __future__ import annotations

from typing import Any

from lightning_hybrid.predictors.base import Plan, Predictor, UpdateStats
from lightning_hybrid.predictors.linear import LinearPredictor
from lightning_hybrid.validation import check_choice

PREDICTORS: dict[str, type[Predictor]] = {cls.name: cls for cls in (LinearPredictor,)}


def build_predictor(name: str, **kwargs: Any) -> Predictor:
    """Instantiate the predictor registered as ``name`` with its settings."""
    check_choice("DynamicsPredictor", "predictor", name, PREDICTORS)
    return PREDICTORS[name](**kwargs)


__all__ = ["PREDICTORS", "LinearPredictor", "Plan", "Predictor", "UpdateStats", "build_predictor"]
