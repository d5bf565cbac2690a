"""What the rules' Triton kernels share: a list of tensors cut into blocks of ``BLOCK`` elements (which tensor and
offset each program handles), a table of the lists' addresses on the device, sent again only when one changed, and
the check, once a process, that a kernel makes what the eager path makes before any run uses it."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch comes without Triton: the eager paths
    triton = None

DEVICE_TYPES = {"cuda"}  # where Triton compiles them (its interpreter, TRITON_INTERPRET=1, runs them on the CPU too)
BLOCK = 4096  # elements a program handles
# whether a kernel agreed with the eager path, per (what, device, variant) (see checked)
_checked: dict[tuple[str, torch.device, tuple[bool, ...]], bool] = {}

if triton is not None:

    @triton.jit
    def address(tables, row, t, n_tensors):
        """Tensor ``t`` of the list in ``row`` of the address table."""
        return tl.load(tables + row * n_tensors + t).to(tl.pointer_type(tl.float32))

    @triton.jit
    def block_of(of_block, start_of_block, numels, B: tl.constexpr):
        """This program's tensor, its elements' offsets in it, and which of them exist."""
        pid = tl.program_id(0)
        t = tl.load(of_block + pid)
        offs = tl.load(start_of_block + pid) + tl.arange(0, B)
        return pid, t, offs, offs < tl.load(numels + t)


class Blocks:
    """Which tensor and offset each program handles, for tensors of ``numels`` elements on ``device``, and the table
    of ``rows`` lists' addresses (:meth:`point_at`): made once per list of sizes and kept, so that a launch after the
    first allocates nothing."""

    def __init__(self, numels: list[int], device: torch.device, rows: int) -> None:
        counts = torch.tensor([max(1, -(-n // BLOCK)) for n in numels])
        first = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        of_block = torch.repeat_interleave(torch.arange(len(numels)), counts)
        start = (torch.arange(len(of_block)) - first[of_block]) * BLOCK
        made = (of_block, start, first, torch.tensor(numels))
        self.of_block, self.start_of_block, self.first_block, self.numels = (
            x.to(device=device, dtype=torch.int64) for x in made
        )
        self.grid = (len(of_block),)
        self.tables = torch.zeros(rows, len(numels), dtype=torch.int64, device=device)
        self.addresses: list[list[int]] = []

    def point_at(self, lists: list[list[Tensor]]) -> None:
        addresses = [[t.data_ptr() for t in tensors] for tensors in lists]
        if addresses != self.addresses:
            self.tables.copy_(torch.tensor(addresses, dtype=torch.int64))
            self.addresses = addresses


_blocks: dict[tuple[torch.device, tuple[int, ...], int], Blocks] = {}


def blocks_for(params: list[Tensor], rows: int) -> Blocks:
    """The kept :class:`Blocks` for tensors of these sizes on their device, with ``rows`` lists' addresses."""
    key = (params[0].device, tuple(p.numel() for p in params), rows)
    return _blocks.get(key) or _blocks.setdefault(key, Blocks(list(key[1]), key[0], rows))


def served(lists: list[list[Tensor]]) -> bool:
    """Whether kernels can run on these lists: Triton, and plain float32 contiguous tensors (no shards' subclass) on
    one device of a type it compiles for."""
    if triton is None or not lists[0]:
        return False
    device = lists[0][0].device
    every = [t for tensors in lists for t in tensors]
    kinds = (Tensor, torch.nn.Parameter)
    if not all(type(t) in kinds and t.device == device and t.dtype == torch.float32 for t in every):
        return False
    return device.type in DEVICE_TYPES and all(t.is_contiguous() for t in every)


def checked(what: str, device: torch.device, variant: tuple[bool, ...], agrees: Callable[[], bool]) -> bool:
    """Whether the kernels of ``what`` compile on ``device`` and make the eager path's result there in ``variant``
    (``agrees``): checked once a process, and said if not."""
    key = (what, device, variant)
    if key not in _checked:
        try:
            _checked[key] = agrees()
            why = "its result differed from the eager path's"
        except Exception as error:  # a compiler or driver the kernels do not run under
            _checked[key], why = False, f"it failed: {type(error).__name__}: {error}"
        if not _checked[key]:
            warnings.warn(f"hybrid: the fused {what} is not used on {device}: {why}; it runs eagerly", stacklevel=4)
    return _checked[key]


def checking_lists(device: torch.device, count: int) -> list[list[Tensor]]:
    """``count`` lists of tensors for a kernel's check: sizes across a block's edge, norms 12 orders of magnitude
    apart, the same draws in every process (a generator of their own)."""
    generator, sizes, norms = torch.Generator().manual_seed(0), [1, 3, BLOCK + 1, 2 * BLOCK + 7], [1e-6, 1.0, 1e6, 1.0]
    return [
        [torch.randn(n, generator=generator).mul_(s).to(device) for n, s in zip(sizes, norms)] for _ in range(count)
    ]


def close(x: Tensor, y: Tensor) -> bool:
    """Within float32 rounding, relative to the tensor's norm."""
    return bool((x - y).norm() <= 1e-6 * y.norm()) and bool(torch.isfinite(x).all())
