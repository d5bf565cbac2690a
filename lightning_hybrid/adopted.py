"""The plugin beside the strategy the user chose. For one fit, the strategy instance takes the plugin's step routing
(:class:`~.strategy.StepRouting`, or :class:`~.fsdp.ShardedRouting` where the parameters are FSDP2 shards) as a
subclass of its own class, the way ``torch.nn.utils.parametrize`` gives a module one, and gets its own class back
when the fit ends. Its launcher, its wrapping, its precision and the user's data pipeline stay as they are: what
the hybrid strategies add beyond the routing (one permutation of a ``StatefulDataLoader`` over ranks) is theirs."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy, Strategy
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_hybrid.fsdp import ShardedRouting
from lightning_hybrid.samplers import one_permutation
from lightning_hybrid.strategy import StepRouting

# strategies the plugin cannot serve, and why (said at setup, before training)
REFUSED = {
    DeepSpeedStrategy: "DeepSpeed's engine owns the optimizer step and the gradients, which the plugin must guard",
    FSDPStrategy: (
        "the plugin's state is per shard, and FSDPStrategy's checkpoints hold rank 0's callbacks only: a resume "
        "would give every rank rank 0's shards. Shard with FSDP2: ModelParallelStrategy, or strategy='hybrid_fsdp'"
    ),
}
_ROUTED: dict[type, type] = {}  # each user strategy class's routed subclass, made once


def adopt(strategy: Strategy, per_step: str | None = None) -> type | None:
    """Give ``strategy`` the plugin's step routing for this fit. Returns its own class, for :func:`give_back`;
    ``None`` for a strategy that routes already (the hybrid strategies). A strategy the plugin cannot serve is
    refused by name, and so is the per-step mode (``per_step``: its predictor's name), which predicts whole steps:
    it needs a hybrid strategy."""
    if isinstance(strategy, StepRouting):
        return None
    own = type(strategy)
    if per_step is not None:
        raise MisconfigurationException(
            f"predictor={per_step!r} runs the per-step mode, which predicts whole steps and owns their dispatch: it "
            f"needs a hybrid strategy, not {own.__name__}. Pass strategy='hybrid' (one device), 'hybrid_ddp' or "
            "'hybrid_fsdp' to the Trainer; the default rule and 'gpa' run beside any."
        )
    for kind, why in REFUSED.items():
        if isinstance(strategy, kind):
            raise MisconfigurationException(f"The hybrid plugin cannot run beside {own.__name__}: {why}.")
    sharded = isinstance(strategy, ModelParallelStrategy)
    if sharded and not strategy._save_distributed_checkpoint:
        raise MisconfigurationException(
            f"The hybrid plugin cannot run beside {own.__name__}(save_distributed_checkpoint=False): its state is "
            "per shard, saved per rank beside a sharded checkpoint; keep save_distributed_checkpoint=True."
        )
    if own not in _ROUTED:
        routing = ShardedRouting if sharded else StepRouting
        name = f"Routed{own.__name__}"  # what the strategy is called while it routes for the plugin
        _ROUTED[own] = type(name, (routing, own), {"__module__": own.__module__, "__doc__": own.__doc__})
    strategy.__class__ = _ROUTED[own]
    return own


def give_back(strategy: Any, own: type | None) -> None:
    """The fit is over: ``strategy`` routes no more steps and, if it was adopted (``own``: its own class), is its own
    class again, with nothing of the plugin's left on it."""
    strategy.attach_step_handler(None)
    if own is None:
        return
    strategy.__class__ = own
    strategy.__dict__.pop("_hybrid", None)
    plugin = strategy.precision_plugin.__dict__
    if isinstance(plugin.get("clip_gradients"), partial):  # the routing's clipping (present gradients, the norm)
        del plugin["clip_gradients"], plugin["clip_grad_by_norm"]


def what_it_goes_without(trainer: Any, own: type) -> str | None:
    """The one thing a fit beside the user's strategy (``own``: its class) goes without, where it has it: a shuffled
    ``StatefulDataLoader`` on several ranks keeps Lightning's sampler wrapper (:mod:`~lightning_hybrid.samplers`)."""
    if trainer.world_size == 1:
        return None
    loaders = CombinedLoader(trainer.train_dataloader).flattened
    if all(one_permutation(loader) is loader for loader in loaders):
        return None
    return (
        f"hybrid: beside {own.__name__}, the shuffled StatefulDataLoader keeps Lightning's sampler "
        "wrapper, whose ranks draw their own orders (shards can overlap, a mid-epoch resume draws anew); "
        "strategy='hybrid_ddp' or 'hybrid_fsdp' gives it one permutation, sharded, that resumes exactly."
    )
