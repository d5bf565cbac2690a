"""The built-in prediction families, each one module (importing this package registers them), and the lookup of
the family that runs a predictor."""

from typing import Any

from lightning_hybrid.engine.families.averaging import PrimalAverages
from lightning_hybrid.engine.families.jumps import OuterJumps
from lightning_hybrid.engine.families.segments import PredictSegments
from lightning_hybrid.engine.family import FAMILIES, PredictionFamily


def family_of(predictor: Any) -> type[PredictionFamily]:
    """The family that runs ``predictor``."""
    name = getattr(predictor, "family", None)
    if name not in FAMILIES:
        raise ValueError(
            f"{getattr(predictor, '__name__', type(predictor).__name__)} names the prediction family {name!r}, which "
            f"is not registered (known: {sorted(FAMILIES)}); register it with lightning_hybrid.engine.register_family"
        )
    return FAMILIES[name]


__all__ = ["OuterJumps", "PredictSegments", "PrimalAverages", "family_of"]
