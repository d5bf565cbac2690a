"""What a ``HybridScheduler`` is built from and where its parts go: its settings routed to the components it brings
(the predictor's host and the divergence monitor; the per-step mode's residual corrector and horizon bandit), and
their places among the Trainer's callbacks at setup."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.routing import DEFAULT_RULE, ignored_message, route
from lightning_hybrid.callbacks.wiring import find_component, find_own, used_corrector
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import family_of
from lightning_hybrid.validation import check_optional_bool


@dataclass
class Assembly:
    """The phase settings, the components brought (in the order Lightning runs them after the scheduler), what was
    given for each (a component of that kind listed as well is refused), and the settings said to be unread."""

    config: HybridConfig
    components: list[HybridComponent]
    given: dict[str, list[str]]
    rule_settings: dict[str, Any]
    told_ignored: set[str]


def assemble(config: HybridConfig | None, predictor: Any, bandit: bool | None, settings: dict[str, Any]) -> Assembly:
    """Route ``settings`` and build what a run of ``predictor`` needs; every value is checked by its owner now, and
    a setting the mode does not read is warned about, once."""
    check_optional_bool("HybridScheduler", "bandit", bandit)
    routed = route("HybridScheduler", predictor, settings)
    owners = routed.owners
    if config is not None and owners["config"]:
        raise ValueError(
            f"HybridScheduler: pass either `config` or phase settings, not both (got {sorted(owners['config'])})"
        )
    given = {owner: sorted(named) for owner, named in owners.items() if named and owner != "config"}
    if predictor != DEFAULT_RULE:
        given.setdefault("predictor", []).insert(0, "predictor")
    family = routed.family
    host = DynamicsPredictor(predictor, predictor_kwargs=owners["predictor"], **owners["host"])
    corrector = ResidualCorrector(**owners["corrector"])  # built either way: its settings are checked either way
    horizon_bandit = HorizonBandit(**owners["bandit"])
    components: list[HybridComponent] = [host, DivergenceMonitor(**owners["monitor"])]
    components += [corrector] if family.uses_corrector else []
    components += [horizon_bandit] if (family.chooses_horizons if bandit is None else bandit) else []
    if routed.unread:
        rank_zero_warn(ignored_message(family, host.name, routed.unread))
    config = config if config is not None else HybridConfig(**owners["config"])
    return Assembly(config, components, given, owners["predictor"], set(routed.unread))


def place(trainer: pl.Trainer, scheduler: pl.Callback, components: list[HybridComponent]) -> None:
    """Place each brought component whose kind no listed callback is, right after the scheduler and in its order, so
    that Lightning runs its hooks and checkpoints it like any listed callback."""
    at = trainer.callbacks.index(scheduler) + 1
    for component in components:
        if not any(isinstance(cb, type(component)) for cb in trainer.callbacks):
            trainer.callbacks.insert(at, component)
        if component in trainer.callbacks:
            at = trainer.callbacks.index(component) + 1


def find_parts(trainer: pl.Trainer, scheduler: Any) -> tuple[DynamicsPredictor, type, Any, DivergenceMonitor, Any]:
    """The run's components at setup: each the listed one of its kind, or the scheduler's own, placed; and the
    predictor's family. Returns the host, the family, the residual correction (``None`` where the mode uses none),
    the monitor and the bandit (``None`` where neither brought nor listed)."""
    place(trainer, scheduler, scheduler.components)
    own = {type(c): c for c in scheduler.components}
    given = scheduler.given
    host = find_own(trainer, scheduler, own[DynamicsPredictor], [*given.get("predictor", []), *given.get("host", [])])
    try:
        family = family_of(host.predictor)
    except ValueError as err:  # an unregistered family, refused by name before training
        raise MisconfigurationException(str(err)) from err
    corrector = used_corrector(trainer, scheduler, family, host.name, own.get(ResidualCorrector))
    monitor = find_own(trainer, scheduler, own[DivergenceMonitor], given.get("monitor"))
    bandit = own.get(HorizonBandit)  # only where brought or listed
    bandit = find_own(trainer, scheduler, bandit, given.get("bandit")) if bandit else None
    return host, family, corrector, monitor, bandit or find_component(trainer, scheduler, HorizonBandit, None)
