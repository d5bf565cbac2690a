"""What the training app does with a composed config: build, fit, validate, and for ``mode=compare`` run plain
Lightning and hybrid training with the same seed and report them side by side."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.comparison import COUNTS, RunResult, comparison_table, plot_comparison
from lightning_hybrid.hydra_settings import changed_settings
from lightning_hybrid.meter import RunMeter
from lightning_hybrid.resume import LAST, Unreadable, check_checkpoint, find_checkpoint, the_one_before
from lightning_hybrid.settings import check_choice

MODES = ("train", "plain", "compare")
PLAIN_STRATEGY = {"hybrid": "auto", "hybrid_ddp": "ddp", "hybrid_fsdp": "plain_fsdp"}  # each one's plain parent
log = logging.getLogger(__name__)  # under the app, Hydra sends it to the console and the run's train.log


def _build(node: Any, **kwargs: Any) -> Any:
    """``instantiate``, re-raising a component's own ``ValueError``/``TypeError`` rather than Hydra's wrapper, so
    the message names the setting, the value and what is allowed."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, (ValueError, TypeError)):
            raise err.__cause__ from None
        raise


class Run(NamedTuple):
    """One run's objects, built and validated but not yet trained."""

    trainer: L.Trainer
    model: L.LightningModule
    data: L.LightningDataModule
    meter: RunMeter


def build_run(cfg: DictConfig, hybrid: bool, extra_callbacks: Sequence[L.Callback] = ()) -> Run:
    """Build one run's objects (plain Lightning when ``hybrid`` is false, with the strategy swapped for its
    Lightning parent); everything is validated here, before any training starts."""
    strategy = cfg.trainer.strategy
    check_choice("trainer", "strategy", strategy, PLAIN_STRATEGY)
    L.seed_everything(cfg.seed, workers=True)
    data = _build(cfg.data)
    model = _build(cfg.model)
    meter = RunMeter(cfg.monitor)
    label = "hybrid" if hybrid else "plain"
    callbacks = [_build(node) for node in cfg.get("callbacks", {}).values()] + [meter, *extra_callbacks]
    callbacks.append(SameStart(_collect_rng_states()))  # each run's batches drawn from the state its build left
    if not cfg.trainer.get("enable_progress_bar", True):  # Lightning refuses a progress bar switched off
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    checkpoints = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    for checkpoint in checkpoints:  # each run of mode=compare keeps its own
        checkpoint.dirpath = os.path.join(checkpoint.dirpath, label) if checkpoint.dirpath else None
    if hybrid:  # the hybrid settings the user set: the app's defaults are not the user's (none is warned about)
        settings = OmegaConf.to_container(cfg.hybrid, resolve=True)
        target = settings.pop("_target_")
        predictor = OmegaConf.to_container(cfg.predictor, resolve=True)  # built by Hydra as the plugin's argument
        callbacks += _build({"_target_": target, **changed_settings(settings), "predictor": predictor})
    logger = _build(cfg.logger, version=label) if cfg.get("logger") else False
    trainer = _build(
        cfg.trainer,
        strategy=strategy if hybrid else PLAIN_STRATEGY[strategy],
        callbacks=callbacks,
        logger=logger,
        enable_checkpointing=bool(checkpoints),
    )
    return Run(trainer, model, data, meter)


class SameStart(L.Callback):
    """Sets the random state, as the first epoch of a fit starts, to the one ``build_run`` left (seeded, the model
    and data built): the batches of a ``shuffle=True`` loader without a generator of its own, and any random
    draw of the first step, then come from that state in both runs of ``mode=compare``, whatever the first run or
    the callbacks' setup drew before. A resumed fit is left as Lightning resumes it."""

    def __init__(self, states: dict[str, Any]) -> None:
        self.states: dict[str, Any] | None = states

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.states is not None and trainer.global_step == 0:
            _set_rng_states(self.states)
        self.states = None


def _checkpoint(cfg: DictConfig, label: str, run: Run) -> Path | None:
    """The checkpoint this run resumes from (``ckpt_path``), checked against the run before anything trains."""
    if cfg.get("ckpt_path") is None:
        return None
    if cfg.mode == "compare" and cfg.ckpt_path != LAST:
        raise ValueError(
            f"ckpt_path={cfg.ckpt_path!r}: mode=compare resumes its plain and hybrid runs each from its own "
            "checkpoints; use ckpt_path=last (with run_dir=<the compare run's folder>)"
        )
    path = find_checkpoint(cfg.ckpt_path, label, cfg.get("run_dir"), cfg.paths.runs_dir, cfg.paths.output_dir)
    try:
        check_checkpoint(path, run.model, hybrid=label == "hybrid")
    except Unreadable as why:
        if cfg.ckpt_path != LAST:  # a file the user named: theirs to choose again
            raise
        path = the_one_before(path, run.model, label == "hybrid", why)
    return path


FITS = {"plain": "plain Lightning", "hybrid": "the hybrid plugin", "train": "the hybrid plugin"}  # by label or mode


def _load_average() -> float | None:
    """The machine's 1-minute load average (``None`` where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _fit(cfg: DictConfig, label: str, run: Run, ckpt_path: Path | None, which: str = "") -> RunResult:
    trainer, model, data, meter = run
    log.info(f"{which}{label}: training with {FITS[label]}")  # train.log names each fit as it starts
    if ckpt_path is not None:
        log.info(f"{label}: resuming from {ckpt_path}")
    started = _load_average()
    trainer.fit(model, data, ckpt_path=ckpt_path, weights_only=True)  # a checkpoint runs no pickled code
    ended, val_batches = _load_average(), sum(trainer.num_val_batches)  # what each validation ran
    val = trainer.validate(model, data, verbose=False)[0].get(cfg.monitor) if cfg.validate else None
    scheduler = find_scheduler(trainer)
    summary = scheduler.summary() if scheduler is not None and scheduler.engine.family is not None else {}
    mode = summary.get("mode")
    return RunResult(
        label=label,
        val_loss=None if val is None else float(val),
        train_seconds=meter.train_seconds,
        train_cpu_seconds=meter.train_cpu_seconds,
        backward_passes=meter.backward_passes,
        steps=trainer.global_step,
        mode=mode,
        counts={key: summary[key] for key in COUNTS.get(mode, ())},
        validations=_with_final(meter.validations, (trainer.global_step, *meter.elapsed()), val),
        resumed_from=None if ckpt_path is None else str(ckpt_path),
        load=None if started is None or ended is None else (started, ended),
        val_seconds=meter.val_seconds,
        val_every=trainer.val_check_interval if isinstance(trainer.val_check_interval, int) else None,
        val_batches=int(val_batches) if math.isfinite(val_batches) else None,
        val_count=len(meter.validations),
    )


def _with_final(validations: list, end: tuple[int, float, float], val: Any) -> list[tuple[int, float, float, float]]:
    """The validations inside fit, and the one after it (at ``end``: step, wall and CPU seconds) where it was at a
    step none of them was."""
    out = list(validations)
    if val is not None and all(v[0] != end[0] for v in out):
        out.append((*end, float(val)))
    return out


class SettingError(ValueError):
    """A setting the app refuses before anything trains: the component's (or Lightning's) own message."""


def _prepare(cfg: DictConfig) -> tuple[dict[str, Run], dict[str, Path | None]]:
    """Every run the mode makes (``plain``, ``hybrid``), built and checked with the checkpoint each resumes from,
    before any trains; a refused setting raises :class:`SettingError`."""
    try:
        check_choice("app", "mode", cfg.mode, MODES)
        labels = ("plain", "hybrid") if cfg.mode == "compare" else ("hybrid" if cfg.mode == "train" else "plain",)
        runs = {label: build_run(cfg, hybrid=label == "hybrid") for label in labels}
        return runs, {label: _checkpoint(cfg, label, r) for label, r in runs.items()}
    except (ValueError, TypeError, InstantiationException, MisconfigurationException) as err:
        raise SettingError(str(err)) from err


def run(cfg: DictConfig) -> float | None:
    """Train as ``cfg.mode`` says; return the validation ``monitor`` value of the (hybrid) run, for sweepers."""
    runs, resume = _prepare(cfg)
    if cfg.mode != "compare":
        label = next(iter(runs))  # the one run
        result = _fit(cfg, cfg.mode, runs[label], resume[label])
        if result.val_loss is not None:
            log.info(f"final {cfg.monitor}: {result.val_loss:.4f}")
        return result.val_loss
    results = {
        label: _fit(cfg, label, r, resume[label], f"fit {i} of 2, ") for i, (label, r) in enumerate(runs.items(), 1)
    }
    target = results["plain"].val_loss
    for label, result in results.items():  # when each first reached plain's final validation loss, if it did
        meter = runs[label].meter
        end = (result.steps, result.train_seconds, result.train_cpu_seconds)
        final = end if target is not None and result.val_loss <= target else None
        result.reached_plain_at = meter.first_reached(target) or final if target is not None else None
    log.info("\n" + comparison_table(results["plain"], results["hybrid"]))
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({k: asdict(v) for k, v in results.items()}, indent=2))
    plot = plot_comparison(results["plain"], results["hybrid"], out / "compare.png")
    log.info(f"compare: {out / 'compare.json'}" + (f" and {plot}" if plot else ""))
    return results["hybrid"].val_loss
