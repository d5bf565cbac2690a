"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for an unchanged LightningModule through Lightning's
:class:`~lightning.pytorch.strategies.ModelParallelStrategy`, and its hybrid strategy for the per-step mode.

Under any FSDP2 strategy every rank keeps, predicts and rolls back only its own shards, and every statistic a phase
decision reads is reduced over the ranks first, so the ranks always take the same decisions (the scheduler's
:mod:`~lightning_hybrid.callbacks.ranks`); the plugin's state, per shard, is saved per rank inside the sharded
checkpoint (:mod:`~lightning_hybrid.callbacks.sharded_state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.fabric.utilities.init import _materialize_distributed_module
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.strategy import _ForwardRedirection
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn import Module
from typing_extensions import override

from lightning_hybrid.samplers import one_permutation
from lightning_hybrid.step_routing import StepRouting

if TYPE_CHECKING:
    import lightning.pytorch as pl


class FullyShardedStrategy(ModelParallelStrategy):
    """FSDP2 for an unchanged LightningModule (``strategy="plain_fsdp"``): the plain-Lightning parent of
    :class:`HybridFSDPStrategy`, and the baseline the app and the harness compare it with.

    Unless the module's ``configure_model`` already applied ``fully_shard``, the strategy shards every module whose
    class is in ``auto_wrap_policy`` and then the whole model, over all ranks (Lightning's
    ``ModelParallelStrategy`` alone requires the module to shard itself). Each step runs inside the module's own
    call, so a step that calls a submodule (``self.net(x)``) finds its parameters gathered. Checkpoints are sharded
    (a folder with one file per rank).

    Args:
        auto_wrap_policy: module classes to shard as separate units (for example the transformer block), so only
            one unit's parameters are gathered at a time; by default the model is one unit.
        process_group_backend: ``"gloo"`` on CPU, ``"nccl"`` on CUDA by default.
        **kwargs: ``timeout``, as for :class:`~lightning.pytorch.strategies.ModelParallelStrategy`.
    """

    strategy_name = "plain_fsdp"

    def __init__(
        self,
        auto_wrap_policy: set[type[Module]] | None = None,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        if "save_distributed_checkpoint" in kwargs or "tensor_parallel_size" in kwargs:
            raise ValueError(
                f"{name} always saves sharded checkpoints and shards over all ranks: "
                "`save_distributed_checkpoint` and `tensor_parallel_size` cannot be set."
            )
        policy = set(auto_wrap_policy or ())
        bad = sorted(str(c) for c in policy if not (isinstance(c, type) and issubclass(c, Module)))
        if bad:
            raise ValueError(f"{name}: auto_wrap_policy must hold torch.nn.Module classes, got {bad}")
        super().__init__(process_group_backend=process_group_backend, **kwargs)
        self.auto_wrap_policy = policy
        self._forward_redirection = _CallRoot()  # Lightning's slot for running a step through a wrapper's call

    @override
    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # pure data parallelism over every rank
        self._tensor_parallel_size = 1
        super().setup_environment()

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        """ModelParallelStrategy's setup, with the sharding done here when the module did not do it itself (nor an
        earlier ``fit``, ``validate`` or ``test`` of this Trainer: a module is sharded once)."""
        assert self.model is not None and self.accelerator is not None
        self.accelerator.setup(trainer)
        units = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        if not units:
            self._shard(self.model)
        for unit in units:  # sharded already: a forward without backward left the root's parameters gathered
            unit.reshard()
        _materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Every rank its own shard of one permutation (:func:`~lightning_hybrid.samplers.one_permutation`)."""
        return one_permutation(super().process_dataloader(dataloader))

    # ---------------------------------------------------------------------------- steps through the root's call
    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.train_step_context():
            return self._through_root("training_step", *args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self._through_root("validation_step", *args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self._through_root("test_step", *args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self._through_root("predict_step", *args, **kwargs)

    def _through_root(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run the module's ``method`` inside its own ``__call__``, as Lightning runs a step through a wrapper:
        ``fully_shard`` changes the module in place, and its hooks gather the parameters only when the module
        itself is called. Most steps call a submodule (``self.net(x)``) or its methods (an LSTM's
        ``init_hidden``), which would meet the parameters still sharded."""
        assert self.model is not None and self.lightning_module is not None
        return self._forward_redirection(self.model, self.lightning_module, method, *args, **kwargs)

    def _shard(self, model: Module) -> None:
        mesh = self.device_mesh["data_parallel"]
        for module in model.modules():
            if module is not model and type(module) in self.auto_wrap_policy:
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)


class _CallRoot(_ForwardRedirection):
    """Lightning's forward redirection where the wrapper is the module itself: afterwards the module's own
    ``forward`` is its class's again (no instance attribute left behind)."""

    @override
    def on_after_outer_forward(self, wrapper_module: Module, original_module: Module) -> None:
        original_module.__dict__.pop("forward", None)


class HybridFSDPStrategy(StepRouting, FullyShardedStrategy):
    """Hybrid predictive training with fully sharded data parallelism (``strategy="hybrid_fsdp"``).

    Shards like :class:`FullyShardedStrategy` (same arguments); every rank predicts, checks and rolls back only
    its own shards.
    """

    strategy_name = "hybrid_fsdp"
