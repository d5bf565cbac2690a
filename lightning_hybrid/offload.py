"""Device state held in host memory: an optimizer's state during a Predict segment, a rule's between cycle ends
(:class:`HostHeld`), and host copies for checkpoints."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.optim import Optimizer


def host_like(t: Tensor) -> Tensor:
    """An empty CPU tensor shaped like ``t``; pinned when ``t`` is on CUDA, so copies can run asynchronously."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)


def host_copies(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Host copies of ``tensors``, for a checkpoint."""
    return [t.detach().to("cpu", copy=True) for t in tensors]


def host_views(like: list[Tensor]) -> list[Tensor]:
    """Zeroed host tensors shaped like ``like``, views of one buffer per dtype, pinned when ``like`` is on CUDA:
    pinning costs a driver call per allocation, so a model's worth is pinned in one."""
    out: dict[int, Tensor] = {}
    pinned = any(t.is_cuda for t in like)
    for dtype in dict.fromkeys(t.dtype for t in like):
        which = [i for i, t in enumerate(like) if t.dtype == dtype]
        sizes = [like[i].numel() for i in which]
        flat = torch.zeros(sum(sizes), dtype=dtype, device="cpu", pin_memory=pinned)
        out.update((i, piece.view(like[i].shape)) for i, piece in zip(which, flat.split(sizes)))
    return [out[i] for i in range(len(like))]


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


class HostHeld:
    """Tensors shaped like a list of device tensors, held in host memory and on the device only while in use.

    :meth:`on_device` brings them over (or, with ``fill=False``, allocates room for values about to be written) and
    keeps them there until :meth:`put_away`, which copies them back if they were written and lets the device
    copies go. On CUDA the host copies are pinned and the copy back runs on a side stream, so it overlaps the steps
    that follow; the next :meth:`on_device` waits for it on the device and :meth:`values` on the host. The same
    path runs on a CPU (where it saves nothing and costs the copies), which is how it is tested without a GPU.
    """

    def __init__(self, like: list[Tensor]) -> None:
        self.host = host_views(like)
        self._device = like[0].device if like else torch.device("cpu")
        self._on_device: list[Tensor] | None = None
        self._written = False
        self._stream: torch.cuda.Stream | None = None
        self._copied: torch.cuda.Event | None = None  # the last copy back, on the side stream

    @property
    def held(self) -> bool:
        """Whether device copies exist now."""
        return self._on_device is not None

    def on_device(self, fill: bool = True, write: bool = False) -> list[Tensor]:
        """The tensors on the device: the host values (``fill``) or uninitialised room; ``write``: they will change."""
        if self._on_device is None:
            cuda = self._device.type == "cuda"
            if cuda and self._copied is not None:
                torch.cuda.current_stream(self._device).wait_event(self._copied)  # the host copies are complete
            if fill:
                self._on_device = [h.to(self._device, non_blocking=cuda, copy=True) for h in self.host]
            else:
                self._on_device = [torch.empty_like(h, device=self._device) for h in self.host]
        self._written = self._written or write or not fill
        return self._on_device

    def put_away(self) -> None:
        """Copy the device copies back if they were written, and let them go."""
        on_device, self._on_device = self._on_device, None
        if on_device is None or not self._written:
            self._written = False
            return
        if self._device.type != "cuda":
            with torch.no_grad():
                torch._foreach_copy_(self.host, on_device)
        else:
            current = torch.cuda.current_stream(self._device)
            if self._stream is None:
                self._stream = torch.cuda.Stream(self._device)
            self._stream.wait_stream(current)  # the values are written by kernels still queued there
            with torch.cuda.stream(self._stream):
                for h, t in zip(self.host, on_device):
                    h.copy_(t, non_blocking=True)
                    t.record_stream(self._stream)  # not reused before the copy has read it
                self._copied = torch.cuda.Event()
                self._copied.record(self._stream)
        self._written = False

    def zero_(self) -> None:
        """Set every value to zero, on the host (any device copies are dropped first)."""
        self.drop()
        torch._foreach_zero_(self.host)

    def drop(self) -> None:
        """Forget the device copies, and wait for every copy that may still read or write the host ones: after it
        the host tensors may be written directly (a checkpoint's values)."""
        if self._on_device is not None and self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()  # a copy in may still be reading them
        self._on_device, self._written = None, False
        if self._copied is not None:
            self._copied.synchronize()

    def values(self) -> list[Tensor]:
        """The current values, on the host (for a checkpoint): the device copies if held, else the host ones."""
        if self._on_device is not None:
            return host_copies(self._on_device)
        if self._copied is not None:
            self._copied.synchronize()
        return [t.clone() for t in self.host]
