"""The same run on any machine under any load: no decision reads the clock unless the user asks (``cost="wall"``),
so a run made beside CPU-bound processes, and a resume made under load, end bitwise as the run made on an idle
machine, in the default rule and in the per-step mode with its horizon bandit."""

import itertools
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import HorizonBandit, hybrid_callbacks
from lightning_hybrid.algorithms import LinUCBHorizons
from lightning_hybrid.engine import engine as engine_module
from tests.helpers import (
    RESUME_SETTINGS,
    RULE,
    RegressionModel,
    cpu_bound,
    flat_params,
    hybrid_trainer,
    loader,
    scheduler_of,
)

STEPS = 40
MODES = {
    "default": lambda **kw: hybrid_callbacks(**RULE, **kw),
    "per-step": lambda **kw: hybrid_callbacks(predictor="linear", **RESUME_SETTINGS, **kw),  # the bandit chooses
}


def _fit(mode: str, root, ckpt_path=None, save: bool = False, **settings):
    """The run, and what its bandit learnt (the per-step mode): each arm's regression, bitwise."""
    extra = [ModelCheckpoint(root / "ckpt", every_n_train_steps=20, save_top_k=-1, filename="{step}")] if save else []
    trainer, _ = hybrid_trainer(
        STEPS,
        hybrid=MODES[mode](**settings),
        extra_callbacks=extra,
        logger=False,
        enable_checkpointing=save,
        default_root_dir=root,
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)  # 2 steps an epoch: checkpoints at its end
    bandit = next((c.horizons for c in trainer.callbacks if isinstance(c, HorizonBandit)), None)
    learnt = None if bandit is None else {k: v for k, v in bandit.state_dict().items() if k != "episode"}
    return flat_params(model), learnt, scheduler_of(trainer).summary()


def _same(a, b) -> bool:
    params_a, learnt_a, _ = a
    params_b, learnt_b, _ = b
    if (learnt_a is None) != (learnt_b is None):
        return False
    same_bandit = learnt_a is None or all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(learnt_a.values(), learnt_b.values())
    )
    return torch.equal(params_a, params_b) and same_bandit


@pytest.mark.parametrize("mode", list(MODES))
def test_a_run_beside_cpu_bound_processes_and_a_resume_under_load_end_as_the_idle_run(tmp_path, mode):
    idle = _fit(mode, tmp_path / "idle", save=True)
    if mode == "per-step":
        played = sum(n for arm, n in idle[2]["arm_counts"].items() if arm != "0")
        assert played >= 2 and idle[2]["steps_by_phase"]["predict"] > 0  # the bandit chose horizons
    else:
        assert idle[2]["jumps_made"] >= 1
    with cpu_bound():
        loaded = _fit(mode, tmp_path / "loaded")
        resumed = _fit(mode, tmp_path / "resumed", ckpt_path=tmp_path / "idle" / "ckpt" / "step=20.ckpt")
    assert _same(idle, loaded), "a run under load ended elsewhere than the same run on an idle machine"
    assert _same(idle, resumed), "a resume made under load ended elsewhere than the uninterrupted run"


def _clock(monkeypatch, seconds_a_reading: float) -> None:
    """The engine's clock, the test's own: each reading ``seconds_a_reading`` after the one before, so a step's
    measured seconds are what the test chose, not what the machine took."""
    readings = itertools.count()
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(perf_counter=lambda: next(readings) * seconds_a_reading))


def test_charging_steps_their_seconds_is_asked_for_and_warned_about(tmp_path, monkeypatch):
    """``cost="wall"`` makes the bandit's regressions depend on the clock: the same seed learns different rewards
    when its steps take longer (what the test above would catch), and choosing it says so. ``cost="steps"`` does
    not read the clock: the same two clocks give the same run."""
    assert LinUCBHorizons().cost == "steps"
    runs = {}
    for cost, seconds in itertools.product(("wall", "steps"), (0.001, 0.003)):
        _clock(monkeypatch, seconds)
        if cost == "wall" and seconds == 0.001:
            with pytest.warns(UserWarning, match=r"cost='wall' charges each step its measured seconds.*depend on how"):
                runs[cost, seconds] = _fit("per-step", tmp_path / f"{cost}-{seconds}", cost=cost)
        else:
            runs[cost, seconds] = _fit("per-step", tmp_path / f"{cost}-{seconds}", cost=cost)
    assert not _same(runs["wall", 0.001], runs["wall", 0.003])
    assert _same(runs["steps", 0.001], runs["steps", 0.003])
