"""The parameter store: this rank's trainable tensors by optimizer group, the one parameter-sized buffer that holds
either the last ordinary update or a segment's rollback snapshot (kept for the run, or held only while in use),
and what ``predict_memory`` moves off the device while a segment runs. Every operation is one fused
``torch._foreach_*`` call over the tensor lists, but the capture's first pass (see :meth:`before_update`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_hybrid.offload import OptimizerStateOffload, host_like


def copy_(dst: list[Tensor], src: Sequence[Tensor]) -> None:
    with torch.no_grad():
        torch._foreach_copy_(dst, list(src))


def refuse_sparse(module: torch.nn.Module) -> None:
    """The store's fused norms and update capture need dense gradients: a sparse embedding is refused by name."""
    sparse = [
        f"{name}.weight" if name else "weight"
        for name, m in module.named_modules()
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
    ]
    if sparse:
        raise ValueError(
            f"Hybrid training needs dense gradients, but {sparse} would get sparse ones (`sparse=True` on the "
            "embedding). Build the embedding with sparse=False, or train this model without the plugin."
        )


def trainable_signature(optimizer: Optimizer) -> list[list[int]]:
    """Which parameters the optimizer trains now, by group (identities of those that require grad)."""
    return [[id(p) for p in group["params"] if p.requires_grad] for group in optimizer.param_groups]


class ParameterStore:
    """Holds the flat views of the parameters the engine predicts, and their capture/snapshot buffer.

    Args:
        optimizer: the run's single optimizer; its trainable parameters, by group, are what is predicted.
        local: maps a parameter to the part this rank holds (identity unless sharded).
        predict_memory: ``"none"``, ``"offload"`` or ``"aggressive"`` (see :class:`~lightning_hybrid.HybridConfig`).
        buffers: the module's buffers (BatchNorm's running statistics and counters, any registered buffer): held with
            the snapshot, restored on rollback, and put back after every forward pass at predicted weights.
        keep_buffer: hold the parameter-sized buffer for the run; ``False`` allocates it when a capture or a
            snapshot needs it and frees it after (:meth:`release_buffer`, :meth:`release_snapshot`).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        local: Callable[[Tensor], Tensor],
        predict_memory: str = "none",
        buffers: Sequence[Tensor] = (),
        keep_buffer: bool = True,
    ) -> None:
        groups = [[p for p in group["params"] if p.requires_grad] for group in optimizer.param_groups]
        self.signature = trainable_signature(optimizer)
        self.group_index = [i for i, group in enumerate(groups) if group]
        if not self.group_index:
            raise ValueError("The optimizer holds no trainable parameters; hybrid training needs at least one.")
        self.optimizer = optimizer
        self.predict_memory = predict_memory
        self.keep_buffer = keep_buffer
        self.owners = [p for i in self.group_index for p in groups[i]]  # the parameters, holding `.grad`
        self.groups = [[local(p) for p in groups[i]] for i in self.group_index]  # under FSDP, this rank's shards
        self.params = [p for group in self.groups for p in group]
        self.offload = OptimizerStateOffload(optimizer) if predict_memory != "none" else None
        self.snapshot_alive = False  # a segment's start is held, awaiting its verdict
        self.snapshot_on_host = False
        self.host_snapshot: list[Tensor] = []  # predict_memory="aggressive": the rollback snapshot, on the host
        self.buffer: list[Tensor] = []
        self.buffer_groups: list[list[Tensor]] = []
        if keep_buffer:
            self._allocate_buffer()
        self.module_buffers = [local(b) for b in buffers]
        self.module_buffers_at_start = [torch.empty_like(b) for b in self.module_buffers]  # a segment's start

    def trainable_changed(self) -> bool:
        """Whether parameters were frozen, unfrozen or added (a new param group) since the store was built."""
        return trainable_signature(self.optimizer) != self.signature

    def any_frozen(self) -> bool:
        """Whether a parameter the store predicts has stopped requiring grad (cheap: one flag per tensor)."""
        return not all(p.requires_grad for p in self.owners)

    def lrs(self) -> list[float]:
        groups = self.optimizer.param_groups
        return [float(groups[i]["lr"]) for i in self.group_index]

    def _allocate_buffer(self, tensors: list[Tensor] | None = None) -> None:
        self.buffer = tensors if tensors is not None else [torch.empty_like(p) for p in self.params]
        sizes = [len(group) for group in self.groups]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self.buffer_groups = [self.buffer[s : s + n] for s, n in zip(starts, sizes)]

    def buffer_replaced(self) -> None:
        """The buffer's list now holds other tensors (a jump's landing point, taken over without a copy): its
        groups follow."""
        self._allocate_buffer(self.buffer)

    def _ensure_buffer(self) -> None:
        if not self.buffer:
            self._allocate_buffer()

    def _free_buffer(self) -> None:
        if not self.keep_buffer:
            self.buffer, self.buffer_groups = [], []

    # -- capture: the buffer holds an ordinary step's update, new - old ------------------------------------------
    def before_update(self) -> None:
        """Hold ``-old``, so that one addition after the update leaves ``new - old`` (no negation pass)."""
        with torch.no_grad():
            if self.buffer:  # foreach ops have no `out=`: one pass per tensor, each writing the held buffer
                for held, p in zip(self.buffer, self.params):
                    torch.neg(p, out=held)
            else:
                self._allocate_buffer(list(torch._foreach_neg(self.params)))

    def after_update(self) -> None:
        with torch.no_grad():
            torch._foreach_add_(self.buffer, self.params)

    def hold_params(self) -> None:
        """Copy the weights into the buffer (allocated if not held), to put them back later."""
        self._ensure_buffer()
        copy_(self.buffer, self.params)

    def release_buffer(self) -> None:
        """What the buffer held has been used: free it, unless kept or holding a snapshot."""
        if not self.snapshot_alive:
            self._free_buffer()

    # -- prediction ----------------------------------------------------------------------------------------------
    def add(self, directions: Sequence[Sequence[Tensor]], alphas: list[float]) -> None:
        """Add ``alphas[g]`` times each group's direction to its parameters, in place."""
        with torch.no_grad():
            for params, dirs, alpha in zip(self.groups, directions, alphas):
                if alpha != 0.0:
                    torch._foreach_add_(params, list(dirs), alpha=alpha)

    # -- snapshot and rollback -----------------------------------------------------------------------------------
    def take_snapshot(self) -> None:
        """A segment starts: hold the weights, and free what Predict does not need (``predict_memory``)."""
        if self.predict_memory == "aggressive":
            if not self.host_snapshot:
                self.host_snapshot = [host_like(p) for p in self.params]
            copy_(self.host_snapshot, self.params)
            self.snapshot_on_host = True
            self.buffer, self.buffer_groups = [], []
        else:
            self._ensure_buffer()
            copy_(self.buffer, self.params)
        self._hold_module_buffers()
        if self.offload is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.offload.offload()
        self.snapshot_alive = True

    def restore_optimizer_state(self) -> None:
        """Predicted steps are over: bring the optimizer state back in time for the next update."""
        if self.offload is not None:
            self.offload.restore()

    def wait_for_optimizer_state(self) -> None:
        if self.offload is not None:
            self.offload.wait()

    def _hold_module_buffers(self) -> None:
        if self.module_buffers:
            copy_(self.module_buffers_at_start, self.module_buffers)

    def restore_module_buffers(self) -> None:
        """Undo what a forward pass at predicted weights wrote into the buffers (BatchNorm's statistics)."""
        if self.module_buffers:
            copy_(self.module_buffers, self.module_buffers_at_start)

    def zero_gradients(self) -> None:
        """Zeros for every parameter's gradient: a predicted step under manual optimization leaves its backward pass
        out, and the user's ``training_step`` may clip or read the gradients next (torch's value clipping fails on
        none at all)."""
        for p in self.owners:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    def rollback(self) -> None:
        self.restore_optimizer_state()  # a no-op unless a segment's optimizer state is still offloaded
        copy_(self.params, self.host_snapshot if self.snapshot_on_host else self.buffer)
        self.restore_module_buffers()
        self.release_snapshot()

    def release_snapshot(self) -> None:
        self.snapshot_alive = False
        if self.snapshot_on_host:
            self.snapshot_on_host = False
            if self.keep_buffer:
                self._allocate_buffer()
        self._free_buffer()

    def snapshot(self) -> list[Tensor] | None:
        """A host copy of the held snapshot, for a checkpoint; ``None`` when none is held."""
        if not self.snapshot_alive:
            return None
        held = self.host_snapshot if self.snapshot_on_host else self.buffer
        return [t.detach().to("cpu", copy=True) for t in held]

    def load_snapshot(self, snapshot: list[Tensor]) -> None:
        """Hold a snapshot restored from a checkpoint (a segment was running when it was saved). The module's
        buffers need no copy in the checkpoint: during a segment they keep their values from its start."""
        self.load_buffer(snapshot)
        self._hold_module_buffers()
        self.snapshot_alive = True

    def load_buffer(self, tensors: list[Tensor]) -> None:
        """Fill the buffer from host copies (a checkpoint's snapshot, or an outer-momentum anchor)."""
        self._ensure_buffer()
        copy_(self.buffer, [t.to(b.device) for t, b in zip(tensors, self.buffer)])

    def close(self) -> None:
        """End of fit: a fit that ended inside a segment leaves the optimizer state on its device."""
        if self.offload is not None:
            self.offload.restore()
            self.offload.wait()
