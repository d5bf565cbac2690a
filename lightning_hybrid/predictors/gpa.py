"""``gpa``: generalized primal averaging (Defazio et al., 2025, arXiv 2512.17131) around the user's own optimizer,
an opt-in rule that averages at every step where ``outer`` jumps once a cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import lightning_hybrid.predictors.gpa_fused as gpa_fused
import lightning_hybrid.predictors.gpa_step as gpa_step
from lightning_hybrid.offload import host_copies
from lightning_hybrid.predictors.parameter_sums import squares
from lightning_hybrid.predictors.rules import TensorList, TrajectoryRule, load_into
from lightning_hybrid.settings import Bool, Float, Settings, setting


@dataclass(eq=False)
class PrimalAveraging(Settings, TrajectoryRule):
    """The user's optimizer steps at ``y``; its update becomes the step of ``z``, and ``x`` averages ``z``:

    .. code-block:: text

        z <- z + (the optimizer's update at y)
        x <- mu_x x + (1 - mu_x) z
        y <- mu_y x + (1 - mu_y) z

    The parameters hold ``y`` while training and ``x`` wherever the run is evaluated: validation, checkpoints and
    the end of ``fit`` (the family swaps them, as Lightning's ``WeightAveraging`` swaps its average in). ``z`` and
    ``x`` are two parameter copies; ``y`` is always ``mu_y x + (1 - mu_y) z``, so it is computed again, bitwise, when
    the average is swapped back out. Every step is one Triton kernel on CUDA, or else a few fused ``torch._foreach_*``
    operations over the parameters, with no copy made; a step the guard skipped (on the device or on the host)
    leaves ``z``, ``x`` and ``y`` as they were, bitwise.

    ``mu_x=0`` makes ``x = z``, and ``mu_y=1`` trains at ``x``. The published settings, ``mu_y=0.7`` and
    ``mu_x=0.9967``, average as one-worker DiLoCo does over 32 local steps.
    """

    name = "gpa"
    family = "averaging"

    mu_x: float = setting(
        0.9967,
        "the average's memory: `x ← mu_x x + (1 - mu_x) z` each step (0.9967: one-worker DiLoCo over 32 local "
        "steps; 0.9934 over 16, 0.9984 over 64)",
        Float(0.0, 1.0, open_high=True),
    )
    mu_y: float = setting(
        0.7,
        "where gradients are taken: `y = mu_y x + (1 - mu_y) z` (1: at the average)",
        Float(0.0, 1.0, open_low=True),
    )
    fused: bool = setting(
        True,
        "make each step with one Triton kernel where it serves (CUDA with Triton, float32, unsharded): the "
        "parameters, `z` and `x` read and written once, 6 parameter copies of memory traffic (the floor), against "
        "the eager path's 19. Within float32 rounding of the eager step (tested in fits against the paper's "
        "equations, in Triton's interpreter on the CPU); checked against it on the device as averaging starts, and "
        "eager, said once, if it differs. `False`: the eager path everywhere",
        Bool(),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._z: list[Tensor] = []  # both empty until averaging starts
        self._x: list[Tensor] = []
        self._like: list[Tensor] = []  # the parameters, whose shapes and devices a checkpoint's state takes
        self._set_up = False
        self._kernels = False  # gpa_fused's kernels serve the sequences (decided once they exist)

    def setup(self, params: TensorList, keep_jump: bool) -> None:
        """Nothing is held until the first averaged step (:meth:`start`), or a checkpoint's state arrives."""
        self._like, self._z, self._x, self._kernels = list(params), [], [], False
        self._set_up = True
        self._apply_pending()

    def start(self, params: list[Tensor]) -> None:
        """The first averaged step is about to run: ``z = x = y``, the parameters as they are."""
        with torch.no_grad():
            self._z, self._x = [p.detach().clone() for p in params], [p.detach().clone() for p in params]
        self._choose_path(params)

    def _choose_path(self, params: list[Tensor]) -> None:
        """The sequences exist: the kernels are checked (once a process) and chosen where they serve."""
        self._kernels = self.fused and gpa_fused.usable(list(params), self._z, self._x)

    @property
    def _path(self) -> Any:
        """The module that makes the steps: the kernels' or the eager one."""
        return gpa_fused if self._kernels else gpa_step

    def average(self, params: list[Tensor], kept: Tensor) -> None:
        """The optimizer has stepped ``params`` from ``y``: fold its update into ``z`` and ``x`` and leave the next
        ``y`` in ``params``. ``kept`` (a 0-dim tensor on the parameters' device, 1 or 0) is 0 where the step's update
        was skipped; then nothing changes, bitwise."""
        self._path.average(params, self._z, self._x, kept, self.mu_x, self.mu_y)

    def training_point(self, params: list[Tensor]) -> None:
        """``params := y = mu_y x + (1 - mu_y) z``: where training goes on."""
        self._path.training_point(params, self._z, self._x, self.mu_y)

    def evaluation_point(self, params: list[Tensor]) -> None:
        """``params := x``: the average, where the run is evaluated."""
        with torch.no_grad():
            torch._foreach_copy_(params, self._x)

    def average_point(self) -> list[Tensor]:
        """``x``, the average, as the rule holds it (no copy): what a checkpoint written while training holds."""
        return self._x

    def gap_terms(self, params: TensorList) -> Tensor:
        """``[|y - x|², |y|²]`` over this rank's tensors (a parameter copy while they are summed; read at logging
        steps only): how far training has moved from its average."""
        with torch.no_grad():
            return torch.stack([squares(torch._foreach_sub(params, self._x)).sum(), squares(params).sum()])

    def release(self) -> None:
        if self._set_up:
            self._released = self.state_dict()
            self._z, self._x, self._like, self._set_up, self._kernels = [], [], [], False, False

    def state_dict(self) -> dict[str, Any]:
        if not self._set_up:
            return self._parked({"z": [], "x": []})
        return {"z": host_copies(self._z), "x": host_copies(self._x)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._set_up:
            if state["z"]:
                self._park(state)
            return
        if state["z"]:
            self._z, self._x = [torch.empty_like(p) for p in self._like], [torch.empty_like(p) for p in self._like]
            load_into("PrimalAveraging", "z", self._z, state["z"])
            load_into("PrimalAveraging", "average", self._x, state["x"])
            self._choose_path(self._like)
