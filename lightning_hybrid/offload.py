"""Moving an optimizer's state to host memory for a Predict segment, and back before the next ordinary step."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.optim import Optimizer


def host_like(t: Tensor) -> Tensor:
    """An empty CPU tensor shaped like ``t``; pinned when ``t`` is on CUDA, so copies can run asynchronously."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)


class OptimizerStateOffload:
    """Swaps every tensor of ``optimizer.state`` for a host copy (:meth:`offload`) and back (:meth:`restore`).

    Host buffers are allocated once and reused. The device tensors are dropped while offloaded, so their memory is
    free during the segment. :meth:`restore` allocates fresh device tensors and, on CUDA, copies on a side stream;
    :meth:`wait` makes the current stream wait for that copy, so it overlaps the next step's forward and backward
    and is on the device before the optimizer reads it. The same path runs on every device, a CPU included (where
    it only costs two copies), which is how it is tested without a GPU.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self._host: dict[tuple[int, str], Tensor] = {}
        self._devices: dict[tuple[int, str], torch.device] = {}
        self._stream: torch.cuda.Stream | None = None
        self._pending: torch.cuda.Stream | None = None
        self.offloaded = False

    def _states(self) -> list[tuple[int, dict]]:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return [(i, self.optimizer.state[p]) for i, p in enumerate(params) if p in self.optimizer.state]

    def offload(self) -> None:
        """Copy the state to host memory and release the device tensors (no-op if already offloaded)."""
        if self.offloaded:
            return
        for i, state in self._states():
            for key, value in state.items():
                if not isinstance(value, Tensor):
                    continue
                slot = (i, key)
                host = self._host.get(slot)
                if host is None or host.shape != value.shape or host.dtype != value.dtype:
                    host = self._host[slot] = host_like(value)
                host.copy_(value)  # blocking: a checkpoint taken mid-segment may read it at once
                self._devices[slot] = value.device
                state[key] = host
        self.offloaded = True

    def restore(self) -> None:
        """Start copying the state back to its devices (asynchronously on CUDA); :meth:`wait` before using it."""
        if not self.offloaded:
            return
        for i, state in self._states():
            for key, value in state.items():
                device = self._devices.get((i, key))
                if device is None or value is not self._host.get((i, key)):
                    continue
                state[key] = self._to_device(value, device)
        self.offloaded = False

    def _to_device(self, host: Tensor, device: torch.device) -> Tensor:
        if device.type != "cuda":
            return host.to(device, copy=True)
        current = torch.cuda.current_stream(device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(current)  # the memory it reuses may still be read by queued kernels
        with torch.cuda.stream(self._stream):
            out = torch.empty_like(host, device=device)
            out.copy_(host, non_blocking=True)
        out.record_stream(current)  # it will be used there: keep the allocator from reusing it too early
        self._pending = self._stream
        return out

    def wait(self) -> None:
        """Make the current stream wait for a :meth:`restore` in flight (nothing to do off CUDA)."""
        if self._pending is not None:
            torch.cuda.current_stream(self._pending.device).wait_stream(self._pending)
            self._pending = None
