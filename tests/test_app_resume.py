"""The training app saves its runs and resumes them: checkpoints on by default, ``ckpt_path=PATH`` or ``last``, a run
resumed in any phase (and after a SIGKILL, through the console script) ending as the uninterrupted run does, and
every checkpoint it cannot resume refused by name before anything trains."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_hybrid.hydra_settings import share
from lightning_hybrid.runner import run
from tests.helpers import APP_PHASES, APP_SMALL_GPT, APP_TRAINER, app_config, console

STEPS = 24
# the tiny predicting run of test_app, with the callbacks group's checkpoints (not its progress bar: the Trainer's
# is off), every one of them kept, not only the best by validation loss
BASE = [o for o in APP_TRAINER if not o.startswith(("callbacks=", "trainer.max_steps"))] + APP_PHASES + APP_SMALL_GPT
BASE += [f"trainer.max_steps={STEPS}", "~callbacks.progress_bar"]
BASE += ["callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.monitor=null"]
OUTER = [o for o in BASE if not o.startswith("predictor")] + ["predictor=outer", "predictor.verify_window=2"]
OUTER += ["model.warmup_steps=0"]  # no rate warm-up: the default makes no jump while the rate rises


def _run(out: Path, *overrides: str, predictor: str = "linear") -> None:
    run(app_config(out, *overrides, base=OUTER if predictor == "outer" else BASE))


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _scheduler(path: Path) -> dict:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return next(v for k, v in checkpoint["callbacks"].items() if k.startswith("HybridScheduler"))


def _summary(out: Path) -> dict:
    summary = json.loads((out / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())
    return {
        k: v for k, v in summary.items() if k not in ("wall_time_s", "time_by_phase_s", "memory_peak_bytes_by_phase")
    }


def _val_losses(out: Path) -> dict[int, float]:
    events = EventAccumulator(str(out / "tensorboard" / "hybrid"))
    events.Reload()
    return {e.step: e.value for e in events.Scalars("val_loss")}


def _assert_same_end(resumed: Path, reference: Path) -> None:
    final = f"checkpoints/hybrid/step_{STEPS}.ckpt"
    want, got = _weights(reference / final), _weights(resumed / final)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert _summary(resumed) == _summary(reference)
    logged = _val_losses(resumed)
    assert logged and all(_val_losses(reference)[step] == value for step, value in logged.items())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """The uninterrupted runs, per predictor, with a checkpoint every step kept (on one thread, as conftest runs
    each test: built before the tests' own fixtures, a module's fixture would otherwise run on the default threads)."""
    torch.set_num_threads(1)
    runs = {}
    for predictor in ("linear", "outer"):
        out = tmp_path_factory.mktemp(predictor)
        _run(out, "checkpoint_every=1", predictor=predictor)
        runs[predictor] = out
    return runs


def _first(out: Path, where) -> Path:
    """The first of a run's checkpoints (by step) whose hybrid state satisfies ``where``."""
    paths = sorted((out / "checkpoints" / "hybrid").glob("step_*.ckpt"), key=lambda p: int(p.stem.split("_")[1]))
    return next(p for p in paths if where(_scheduler(p)) and int(p.stem.split("_")[1]) < STEPS)


@pytest.mark.parametrize(
    ("predictor", "phase", "where"),
    [
        ("linear", "mid-Warmup", lambda s: s["machine"]["phase"] == 0 and s["machine"]["phase_step"] > 0),
        ("linear", "mid-Predict", lambda s: s["machine"]["phase"] == 2 and s["machine"]["segment_pos"] > 0),
        ("outer", "jump pending", lambda s: s["family"]["pending"]),
    ],
)
def test_a_run_resumed_from_ckpt_path_ends_as_the_uninterrupted_run(tmp_path, reference, predictor, phase, where):
    path = _first(reference[predictor], where)
    _run(tmp_path, "checkpoint_every=1", f"ckpt_path={path}", predictor=predictor)
    _assert_same_end(tmp_path, reference[predictor])


def test_ckpt_path_last_finds_the_newest_last_checkpoint_of_the_run(tmp_path, reference):
    first = tmp_path / "first"
    _run(first, "checkpoint_every=1", "+callbacks.stop._target_=tests.app_models.StopAt", "+callbacks.stop.step=10")
    assert sum(_scheduler(first / "checkpoints" / "hybrid" / "last.ckpt")["machine"].values()) >= 0
    assert torch.load(first / "checkpoints" / "hybrid" / "last.ckpt", weights_only=True)["global_step"] == 10
    resumed = tmp_path / "resumed"
    _run(resumed, "ckpt_path=last", f"run_dir={first}", "checkpoint_every=1")
    _assert_same_end(resumed, reference["linear"])
    # without run_dir: the latest run under paths.runs_dir
    again = tmp_path / "runs" / "again"
    shutil.copytree(first, tmp_path / "runs" / "earlier")
    _run(again, "ckpt_path=last", f"paths.runs_dir={tmp_path / 'runs'}", "checkpoint_every=1")
    _assert_same_end(again, reference["linear"])


def test_compare_keeps_the_plain_and_hybrid_checkpoints_apart_and_resumes_each(tmp_path):
    first = tmp_path / "first"
    _run(first, "mode=compare", "+callbacks.stop._target_=tests.app_models.StopAt", "+callbacks.stop.step=8")
    assert (first / "checkpoints" / "plain" / "last.ckpt").exists()
    assert (first / "checkpoints" / "hybrid" / "last.ckpt").exists()
    _run(tmp_path / "resumed", "mode=compare", "ckpt_path=last", f"run_dir={first}")
    result = json.loads((tmp_path / "resumed" / "compare.json").read_text())
    assert result["plain"]["resumed_from"].endswith(os.path.join("plain", "last.ckpt"))
    assert result["hybrid"]["resumed_from"].endswith(os.path.join("hybrid", "last.ckpt"))
    assert result["plain"]["steps"] == result["hybrid"]["steps"] == STEPS
    with pytest.raises(ValueError, match="mode=compare resumes its plain and hybrid runs each from its own"):
        _run(tmp_path / "bad", "mode=compare", f"ckpt_path={first / 'checkpoints' / 'hybrid' / 'last.ckpt'}")


def test_callbacks_none_writes_no_checkpoint(tmp_path):
    run(app_config(tmp_path, "trainer.max_steps=4"))  # test_app's runs: callbacks=none
    assert not list(tmp_path.rglob("*.ckpt"))


def test_the_default_checkpoint_interval_is_a_tenth_of_the_run():
    assert share(600, 10) == 60 and share(5, 10) == 1 and share(-1, 10) is None  # by epochs: at their ends


class Payload:
    """Pickled, it runs a command when loaded: what a malicious checkpoint carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _damaged(tmp_path: Path, source: Path, kind: str) -> tuple[Path, str]:
    path = tmp_path / f"{kind}.ckpt"
    if kind == "missing":
        return path, "there is no such file"
    if kind == "not a checkpoint":
        path.write_text("these are not the weights you are looking for")
        return path, "not a checkpoint"
    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    if kind == "another model":
        checkpoint["state_dict"] = {f"other.{k}": v for k, v in checkpoint["state_dict"].items()}
        message = "written for another model"
    elif kind == "newer layout":
        key = next(k for k in checkpoint["callbacks"] if k.startswith("HybridScheduler"))
        checkpoint["callbacks"][key]["version"] = 99
        message = "its hybrid state has version 99, newer than this lightning-hybrid reads"
    else:  # a pickle payload
        checkpoint["payload"] = Payload(tmp_path / "pwned")
        message = "refused: it holds objects only unpickling code could load"
    torch.save(checkpoint, path)
    return path, message


@pytest.mark.parametrize("kind", ["missing", "not a checkpoint", "another model", "newer layout", "payload"])
def test_a_checkpoint_the_run_cannot_resume_is_refused_by_name_before_training(tmp_path, reference, kind):
    source = reference["linear"] / "checkpoints" / "hybrid" / "step_8.ckpt"
    path, message = _damaged(tmp_path, source, kind)
    before = path.read_bytes() if path.exists() else None
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=message) as err:
        _run(out, f"ckpt_path={path}")
    assert str(path) in str(err.value)
    assert not list(out.rglob("*.ckpt")) and not (out / "tensorboard" / "hybrid" / "hybrid_summary.json").exists()
    assert (path.read_bytes() if path.exists() else None) == before  # nothing overwritten
    assert not (tmp_path / "pwned").exists()  # the payload never ran


def test_a_plain_checkpoint_does_not_resume_a_hybrid_run(tmp_path):
    plain = tmp_path / "plain"
    _run(plain, "mode=plain", "trainer.max_steps=4")
    with pytest.raises(ValueError, match="written by a plain Lightning run"):
        _run(tmp_path / "out", f"ckpt_path={plain / 'checkpoints' / 'plain' / 'last.ckpt'}")


@pytest.mark.slow
def test_a_killed_console_run_resumes_from_last_as_if_never_stopped(tmp_path, capfd, reference):
    """The console script SIGKILLed mid-run, in a process of its own; then ``ckpt_path=last`` (the console's
    ``main``, in this process) finds its last checkpoint and ends as the uninterrupted run."""
    script = shutil.which("lightning-hybrid-train")
    assert script, "the package's console script is not installed (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}  # as here
    kill = ["+callbacks.kill._target_=tests.app_models.KillAt", "+callbacks.kill.step=13"]
    args = [script, *BASE, f"hydra.run.dir={tmp_path / 'killed'}", "checkpoint_every=1", *kill]
    killed = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL, mid-run
    last = torch.load(tmp_path / "killed" / "checkpoints" / "hybrid" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 13
    resume = ["ckpt_path=last", f"run_dir={tmp_path / 'killed'}"]
    assert console(*BASE, f"hydra.run.dir={tmp_path / 'resumed'}", "checkpoint_every=1", *resume) == 0
    out = capfd.readouterr().out
    assert "resuming from" in out and "killed" in out
    _assert_same_end(tmp_path / "resumed", reference["linear"])


def test_a_last_checkpoint_cut_short_is_refused_by_name_and_the_one_before_it_resumes(tmp_path, reference, caplog):
    """A run killed while writing ``last.ckpt`` leaves it truncated: ``ckpt_path=last`` says so by name and resumes
    from the newest checkpoint before it, and the run ends as the uninterrupted one. A truncated file named by the
    user is refused (theirs to choose again)."""
    killed = tmp_path / "killed" / "checkpoints" / "hybrid"
    killed.mkdir(parents=True)
    for step in range(1, 14):  # the run died while writing step 14's last.ckpt
        shutil.copy2(reference["linear"] / "checkpoints" / "hybrid" / f"step_{step}.ckpt", killed)
    last = reference["linear"] / "checkpoints" / "hybrid" / f"step_{14}.ckpt"
    (killed / "last.ckpt").write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        _run(tmp_path / "resumed", "checkpoint_every=1", "ckpt_path=last", f"run_dir={tmp_path / 'killed'}")
    said = f"ckpt_path=last: {killed / 'last.ckpt'}: not a checkpoint"
    assert (
        said in caplog.text
        and f"resuming from {killed / 'step_13.ckpt'}, the newest checkpoint before it" in caplog.text
    )
    _assert_same_end(tmp_path / "resumed", reference["linear"])
    with pytest.raises(ValueError, match=r"last\.ckpt: not a checkpoint"):
        _run(tmp_path / "named", f"ckpt_path={killed / 'last.ckpt'}")
