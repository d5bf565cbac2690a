"""VRAMLogger: memory use per step and per phase, and an optional emergency checkpoint when it runs high."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_hybrid.callbacks.base import find_scheduler
from lightning_hybrid.lightning_packages import CALLBACK_BASES
from lightning_hybrid.settings import check_int

MIB = 2**20


def proc_status(field: str) -> int | None:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in bytes; ``None`` where there is no ``/proc``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _total_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class VRAMLogger(*CALLBACK_BASES):
    """Logs memory through the Trainer's loggers after every ``every_n_steps`` optimizer steps and at every phase
    transition, and keeps each phase's peak for ``hybrid_summary.json``. Works in plain Lightning runs too.

    On CUDA it logs ``memory/allocated_mib``, ``memory/max_allocated_mib`` (the peak during the step: the logger
    resets CUDA's peak counter at each step's start) and ``memory/reserved_mib``. On CPU it logs the process's
    ``memory/rss_mib`` and ``memory/peak_rss_mib`` (lifetime peak); there the per-phase peaks are the RSS sampled
    at step ends (Linux ``/proc``).

    Args:
        every_n_steps: log every this many optimizer steps.
        emergency_threshold: off when ``None``; otherwise bytes (an integer) or a fraction of the device's memory
            (a float in ``(0, 1]``, of system RAM on CPU). The first time the memory in use (CUDA allocated, or RSS)
            reaches it on any rank, one checkpoint is saved through the Trainer and a warning raised.
        emergency_filename: name of that checkpoint, in the Trainer's ``default_root_dir``.
    """

    def __init__(
        self,
        every_n_steps: int = 1,
        emergency_threshold: int | float | None = None,
        emergency_filename: str = "emergency.ckpt",
    ) -> None:
        self.every_n_steps = check_int("VRAMLogger", "every_n_steps", every_n_steps, 1)
        t = emergency_threshold
        fraction = isinstance(t, float) and 0 < t <= 1
        if t is not None and (isinstance(t, bool) or not (fraction or (isinstance(t, int) and t > 0))):
            raise ValueError(
                "VRAMLogger: `emergency_threshold` must be None, a number of bytes (an integer > 0) or a fraction "
                f"of device memory (a float in (0, 1]), got {t!r}"
            )
        if not isinstance(emergency_filename, str) or not emergency_filename or os.sep in emergency_filename:
            raise ValueError(
                f"VRAMLogger: `emergency_filename` must be a file name (no directories), got {emergency_filename!r}"
            )
        self.emergency_threshold = t
        self.emergency_filename = emergency_filename
        self.emergency_saved = False
        self.phase_peaks: dict[str, int] = {}
        self._threshold_bytes: int | None = None
        self._phase: str | None = None
        self._last_logged_phase: str | None = None
        self._scheduler: Any = None
        self._root: str | None = None

    @property
    def emergency_path(self) -> Path | None:
        return None if self._root is None else Path(self._root) / self.emergency_filename

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._scheduler = find_scheduler(trainer)
        self._root = trainer.default_root_dir
        device = trainer.strategy.root_device
        t = self.emergency_threshold
        self._threshold_bytes = None if t is None else int(t * _total_memory(device)) if isinstance(t, float) else t

    def hybrid_summary(self) -> dict[str, Any]:
        """What this logger adds to ``hybrid_summary.json`` (the scheduler asks every callback at the end of fit)."""
        return {"memory_peak_bytes_by_phase": dict(self.phase_peaks)}

    @override
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self._phase = self._scheduler.phase.label if self._scheduler is not None else "plain"
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def read(self, device: torch.device) -> dict[str, int]:
        """The memory figures of this moment, in bytes; ``in_use`` is the one peaks and the threshold watch."""
        if device.type == "cuda":
            allocated, peak = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
            return {
                "allocated": allocated,
                "max_allocated": peak,
                "reserved": torch.cuda.memory_reserved(device),
                "in_use": allocated,
                "peak": peak,
            }
        rss = proc_status("VmRSS") or 0
        return {"rss": rss, "peak_rss": proc_status("VmHWM") or rss, "in_use": rss, "peak": rss}

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        figures = self.read(pl_module.device)
        phase = self._phase
        self.phase_peaks[phase] = max(self.phase_peaks.get(phase, 0), figures["peak"])
        transition = phase != self._last_logged_phase
        if transition or trainer.global_step % self.every_n_steps == 0:
            self._last_logged_phase = phase
            metrics = {f"memory/{k}_mib": v / MIB for k, v in figures.items() if k not in ("in_use", "peak")}
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        if self._threshold_bytes is not None and not self.emergency_saved:
            self._check_emergency(trainer, figures["in_use"])

    def _check_emergency(self, trainer: Any, in_use: int) -> None:
        # every rank must take part in the decision and in the checkpoint, which is a collective call
        if trainer.strategy.reduce_boolean_decision(in_use >= self._threshold_bytes, all=False):
            self.emergency_saved = True
            trainer.save_checkpoint(self.emergency_path)
            rank_zero_warn(
                f"VRAMLogger: memory in use reached the emergency threshold ({self._threshold_bytes / MIB:.0f} MiB) "
                f"at step {trainer.global_step}; saved {self.emergency_path} (once per run)."
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"emergency_saved": self.emergency_saved, "phase_peaks": dict(self.phase_peaks)}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.emergency_saved = bool(state["emergency_saved"])
        self.phase_peaks = {str(k): int(v) for k, v in state["phase_peaks"].items()}
