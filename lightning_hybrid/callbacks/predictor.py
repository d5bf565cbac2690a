"""DynamicsPredictor: hosts the predictor so Lightning checkpoints its state with the run."""

from __future__ import annotations

from typing import Any

from typing_extensions import Unpack

from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.encoder import Encoding, StateEncoder
from lightning_hybrid.predictors import PREDICTORS, AnyPredictor, Predictor, TrajectoryRule, build_predictor
from lightning_hybrid.settings import settings_dict

RETIRED = ("average", "search")  # predictors of earlier checkpoints that measured no gain and left the package
EncodingSettings = settings_dict("EncodingSettings", Encoding)


class DynamicsPredictor(HybridComponent):
    """Holds the dynamics model that learns how the weights move, and the state encoder it conditions on.

    Args:
        predictor: a registered name (one of ``lightning_hybrid.predictors.PREDICTORS``; ``outer``, the default) or
            an instance of a :class:`~lightning_hybrid.predictors.TrajectoryRule` or of a per-step
            :class:`~lightning_hybrid.predictors.Predictor`.
        predictor_kwargs: settings of the named predictor (ignored for an instance).
        **settings: ``feature_dim`` (:class:`Encoding`).
    """

    def __init__(
        self,
        predictor: str | AnyPredictor = "outer",
        predictor_kwargs: dict[str, Any] | None = None,
        **settings: Unpack[EncodingSettings],
    ) -> None:
        self.feature_dim = Encoding(**settings).feature_dim
        self.encoder = StateEncoder(dim=self.feature_dim)
        if isinstance(predictor, (Predictor, TrajectoryRule)):
            self.predictor = predictor
        else:
            self.predictor = build_predictor(predictor, **(predictor_kwargs or {}))
        self.name = self.predictor.name

    def _state(self) -> dict[str, Any]:
        return {"name": self.name, "predictor": self.predictor.state_dict(), "encoder": self.encoder.state_dict()}

    def _load(self, state: dict[str, Any]) -> None:
        if state["name"] in RETIRED:
            raise ValueError(
                f"DynamicsPredictor: the checkpoint was written with predictor={state['name']!r}, which was retired "
                f"(it measured no gain; docs/performance.md) and cannot be resumed; known: {sorted(PREDICTORS)}"
            )
        if state["name"] != self.name:
            raise ValueError(
                f"DynamicsPredictor: the checkpoint holds a {state['name']!r} predictor but this run uses "
                f"{self.name!r}; resume with `predictor={state['name']!r}` (known: {sorted(PREDICTORS)})"
            )
        self.predictor.load_state_dict(state["predictor"])
        self.encoder.load_state_dict(state["encoder"])
