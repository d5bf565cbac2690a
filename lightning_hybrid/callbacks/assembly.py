"""What a ``HybridScheduler`` is built from: its settings routed to the components it brings (the predictor's host
and the divergence monitor; the per-step mode's residual corrector and horizon bandit), and at setup the parts a fit
runs with, each the one the user listed among the Trainer's callbacks or else the scheduler's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_warn

from lightning_hybrid.callbacks.bandit import HorizonBandit
from lightning_hybrid.callbacks.base import HybridComponent
from lightning_hybrid.callbacks.corrector import ResidualCorrector
from lightning_hybrid.callbacks.monitor import DivergenceMonitor
from lightning_hybrid.callbacks.predictor import DynamicsPredictor
from lightning_hybrid.callbacks.wiring import (
    check_strategy,
    find_component,
    find_own,
    refuse_untrainable,
    used_corrector,
    warn_ignored,
)
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.engine import Components, family_of
from lightning_hybrid.lightning_packages import MisconfigurationException
from lightning_hybrid.setting_owners import DEFAULT_RULE, by_owner, ignored_message
from lightning_hybrid.settings import check_optional_bool


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
    routed = by_owner("HybridScheduler", predictor, settings)
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


def find_parts(trainer: Any, scheduler: Any) -> tuple[DynamicsPredictor, type, Any, DivergenceMonitor, Any]:
    """The run's components at setup: each the listed one of its kind, or the scheduler's own; and the predictor's
    family. Returns the host, the family, the residual corrector (``None`` where the mode uses none), the monitor
    and the bandit (``None`` where neither brought nor listed)."""
    own = {type(c): c for c in scheduler.components}
    given = scheduler.given
    host = find_own(trainer, own[DynamicsPredictor], [*given.get("predictor", []), *given.get("host", [])])
    try:
        family = family_of(host.predictor)
    except ValueError as err:  # an unregistered family, refused by name before training
        raise MisconfigurationException(str(err)) from err
    corrector = used_corrector(trainer, family, host.name, own.get(ResidualCorrector))
    monitor = find_own(trainer, own[DivergenceMonitor], given.get("monitor"))
    bandit = own.get(HorizonBandit)  # only where brought or listed
    bandit = find_own(trainer, bandit, given.get("bandit")) if bandit else find_component(trainer, HorizonBandit)
    return host, family, corrector, monitor, bandit


@dataclass
class FitParts:
    """What one fit runs with, found and checked at setup."""

    host: DynamicsPredictor
    monitor: DivergenceMonitor
    bandit: HorizonBandit | None
    components: Components  # what the engine connects
    listed: list[HybridComponent]  # the parts the user listed among the callbacks (Lightning holds their states)
    sharded: bool  # the strategy holds the parameters as FSDP2 shards


def fit_parts(trainer: Any, pl_module: Any, scheduler: Any) -> FitParts:
    """The fit's parts (:func:`find_parts`), and what they cannot run with, refused by name before training: a
    module with nothing to train, a strategy the plugin cannot serve, a setting the mode's family refuses."""
    host, family, corrector, monitor, bandit = find_parts(trainer, scheduler)
    listed = [c for c in (host, corrector, monitor, bandit) if any(c is cb for cb in trainer.callbacks)]
    refuse_untrainable(pl_module)
    sharded = check_strategy(trainer.strategy, host.name if family.predicts_steps else None)
    correction, horizons = corrector and corrector.correction, bandit and bandit.horizons
    parts = Components(host.predictor, host.encoder, correction, monitor.divergence, horizons)
    try:
        family.check(scheduler.config, parts, sharded)
    except ValueError as err:
        raise MisconfigurationException(str(err)) from err
    warn_ignored(family, host.name, scheduler.config, monitor.divergence, scheduler.told_ignored)
    return FitParts(host, monitor, bandit, parts, listed, sharded)
