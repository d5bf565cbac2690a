"""Resuming the training app's runs: which file ``ckpt_path`` names (``last``: the newest ``last.ckpt`` of the run
being resumed), and whether it can resume this run at all, checked before anything is trained or written."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_hybrid.callbacks.base import STATE_VERSION

log = logging.getLogger(__name__)

LAST = "last"
SCHEDULER = "HybridScheduler"  # the key of the hybrid state among a checkpoint's callbacks


def find_checkpoint(ckpt_path: str, label: str, run_dir: str | None, runs_dir: str, output_dir: str) -> Path:
    """The checkpoint ``ckpt_path`` names for the ``label`` run (``hybrid`` or ``plain``): a file, or with ``last``
    the newest ``last.ckpt`` that run wrote under ``run_dir``, or under any earlier run in ``runs_dir``."""
    if ckpt_path != LAST:
        path = Path(ckpt_path)
        if not path.is_file():
            raise ValueError(f"ckpt_path={ckpt_path!r}: there is no such file")
        return path
    root = Path(run_dir if run_dir is not None else runs_dir)
    if run_dir is not None and not root.is_dir():
        raise ValueError(f"run_dir={run_dir!r}: there is no such folder")
    here = Path(output_dir).resolve()
    found = [
        p for p in root.rglob("last.ckpt") if p.parent.name == label and here not in p.resolve().parents
    ]  # the run being started has none yet, and must not resume itself
    if not found:
        where = f"run_dir={run_dir!r}" if run_dir is not None else f"the runs under {str(root)!r}"
        raise ValueError(f"ckpt_path=last: no last.ckpt of a {label} run in {where}")
    return max(found, key=lambda p: p.stat().st_mtime)


class Unreadable(ValueError):
    """A file ``torch.load`` cannot read: truncated (a run killed while writing it), damaged, or no checkpoint."""


def the_one_before(path: Path, model: nn.Module, hybrid: bool, why: Unreadable) -> Path:
    """``ckpt_path=last`` found ``path`` unreadable (``why``), as a run killed while writing it leaves it: the newest
    other checkpoint of its folder that this run can resume, said by name; ``why`` again where there is none."""
    others = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: (p.stat().st_mtime_ns, p.name))
    for other in reversed(others):
        try:
            check_checkpoint(other, model, hybrid)
        except ValueError:
            continue
        log.warning(f"ckpt_path=last: {why}; a run killed while writing it leaves it so: resuming from {other}, the "
                    "newest checkpoint before it")  # fmt: skip
        return other
    raise why


def check_checkpoint(path: Path, model: nn.Module, hybrid: bool) -> dict[str, Any]:
    """Load ``path`` safely (``weights_only=True``: no pickled code runs) and refuse, naming the path and what is
    wrong, a file that is not a Lightning checkpoint, one of another model, one of the other mode (plain or
    hybrid) and one of a newer lightning-hybrid. Returns the checkpoint."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).splitlines()[0]
        if "Weights only load failed" in str(err):
            raise ValueError(f"{path}: refused: it holds objects only unpickling code could load ({first})") from err
        raise Unreadable(f"{path}: not a checkpoint ({first})") from err
    except Exception as err:  # torch.load's readers fail on other files in many ways: say which file, and how
        first = str(err).splitlines()[0] if str(err) else ""
        raise Unreadable(f"{path}: not a checkpoint ({type(err).__name__}: {first})") from err
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ValueError(f"{path}: not a Lightning checkpoint (it has no state_dict)")
    _check_weights(path, checkpoint["state_dict"], model.state_dict())
    states = [v for k, v in checkpoint.get("callbacks", {}).items() if k.startswith(SCHEDULER)]
    if hybrid and not states:
        raise ValueError(f"{path}: written by a plain Lightning run (mode=plain): resume it with mode=plain")
    if not hybrid and states:
        raise ValueError(f"{path}: written by a hybrid run: resume it with mode=train")
    version = states[0].get("version", 1) if states else None
    if version is not None and version > STATE_VERSION:
        raise ValueError(
            f"{path}: its hybrid state has version {version}, newer than this lightning-hybrid reads (1 to "
            f"{STATE_VERSION}): resume it with the lightning-hybrid that wrote it"
        )
    return checkpoint


def _check_weights(path: Path, saved: dict[str, Any], model: dict[str, Any]) -> None:
    missing, unexpected = sorted(model.keys() - saved.keys()), sorted(saved.keys() - model.keys())
    if missing or unexpected:
        raise ValueError(
            f"{path}: written for another model: {len(missing)} of this model's weights are missing "
            f"({missing[:3]}...) and {len(unexpected)} are unknown to it ({unexpected[:3]}...)"
        )
    shapes = [k for k in model if tuple(saved[k].shape) != tuple(model[k].shape)]
    if shapes:
        k = shapes[0]
        raise ValueError(
            f"{path}: written for another model: {len(shapes)} weights differ in shape, e.g. {k!r} is "
            f"{tuple(saved[k].shape)} there and {tuple(model[k].shape)} here"
        )
