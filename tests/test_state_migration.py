"""Checkpoints written by earlier layouts of the hybrid state (``tests/data``, written by the code before each
layout change) resume with this code exactly as the uninterrupted run continues; what they cannot resume is refused
by name before anything trains."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_hybrid import hybrid_callbacks
from lightning_hybrid.callbacks.base import STATE_VERSION
from lightning_hybrid.predictors import OuterMomentum
from tests.golden import DATA, FIXTURES, REL_TOL, checkpointed_run, differences
from tests.helpers import plugin_state


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_checkpoint_of_an_earlier_layout_resumes_as_the_uninterrupted_run(tmp_path, name):
    hybrid, model, trainer = FIXTURES[name]
    old = torch.load(DATA / name, weights_only=False)
    assert plugin_state(old).get("version", 1) < STATE_VERSION  # written before this layout
    uninterrupted = checkpointed_run(tmp_path / "full", hybrid(), model=model, trainer=trainer)
    resumed = checkpointed_run(tmp_path / "resumed", hybrid(), DATA / name, model, trainer)
    # The fixture's floats come from the machine that wrote it; the golden runs compare them bitwise where the
    # kernels match. Here: every counter and decision exactly, the weights within float rounding across machines.
    want, got = uninterrupted["behaviour"], resumed["behaviour"]
    # counted since these layouts: an earlier checkpoint holds none of it, so the resumed run counts only its own part
    newer = ("backed_off_by", "confidence_peak")
    assert not differences(
        *({k: v for k, v in s.items() if k not in newer} for s in (want["summary"], got["summary"])), False
    )
    if "confidence_peak" in want["summary"]:
        assert got["summary"]["confidence_peak"] <= want["summary"]["confidence_peak"]
    assert got["params_norm"] == pytest.approx(want["params_norm"], rel=REL_TOL)
    assert got["losses"] == pytest.approx(want["losses"][-len(got["losses"]) :], rel=REL_TOL)


def test_outer_jumps_counted_as_segments_by_the_old_layout_are_counted_as_jumps(tmp_path):
    hybrid, model, trainer = FIXTURES["state_v1_engine_outer_pending.ckpt"]
    old = plugin_state(torch.load(DATA / "state_v1_engine_outer_pending.ckpt", weights_only=False))
    assert old["counters"]["segments_started"] > 0  # the old layout counted jumps as segments
    summary = checkpointed_run(tmp_path, hybrid(), DATA / "state_v1_engine_outer_pending.ckpt", model, trainer)
    summary = summary["behaviour"]["summary"]
    assert summary["mode"] == "jumps" and not {"segments_started", "segments_accepted", "rollbacks"} & set(summary)
    assert summary["jumps_made"] == old["counters"]["segments_started"]  # the pending one is rejected at step 34
    assert summary["jumps_undone"] == old["counters"]["predicted_steps_rolled_back"] + 1


def test_the_state_is_written_in_this_layout(tmp_path):
    hybrid, model, trainer = FIXTURES["state_v1_engine_outer_pending.ckpt"]
    checkpointed_run(tmp_path, hybrid(), model=model, trainer=trainer)
    state = plugin_state(torch.load(tmp_path / "ckpt" / "step=30.ckpt", weights_only=False))
    assert state["version"] == STATE_VERSION == 4
    assert set(state) == {"version", "machine", "policy", "record", "deferred", "family", "unverified", "components"}
    assert state["components"] == {}  # hybrid_callbacks lists every component: Lightning holds their states
    assert state["unverified"]  # a jump awaits its verdict at step 30
    assert state["family"]["name"] == "jumps" and state["family"]["pending"]


def test_the_scheduler_alone_holds_its_components_states_in_its_own(tmp_path):
    """Beside Lightning's strategy the scheduler alone adds nothing to the Trainer's callbacks: the checkpoint holds
    one plugin state, its components' inside it; a checkpoint of version 3 held them as callbacks of their own, and
    resumes (``tests/data/state_v3_alone_*``)."""
    hybrid, model, trainer = FIXTURES["state_v3_alone_outer_pending.ckpt"]
    checkpointed_run(tmp_path, hybrid(), model=model, trainer=trainer)
    saved = torch.load(tmp_path / "ckpt" / "step=14.ckpt", weights_only=False)
    assert [key for key in saved["callbacks"] if not key.startswith("ModelCheckpoint")] == ["HybridScheduler"]
    assert sorted(plugin_state(saved)["components"]) == ["DivergenceMonitor", "DynamicsPredictor"]
    old = torch.load(DATA / "state_v3_alone_outer_pending.ckpt", weights_only=False)
    assert {"DivergenceMonitor", "DynamicsPredictor", "HybridScheduler"} <= set(old["callbacks"])
    assert plugin_state(old)["version"] == 3 and plugin_state(old)["unverified"]  # a jump awaits its verdict


@pytest.mark.parametrize(
    ("name", "predictor", "message"),
    [
        ("state_v1_engine_outer_pending.ckpt", "linear", "written by an outer run"),
        ("state_v1_mid_segment.ckpt", "outer", "written by a per-step predictor's run"),
        ("state_v1_engine_average.ckpt", "outer", "predictor='average', which was retired"),
    ],
)
def test_an_old_checkpoint_of_another_family_is_refused_by_name(tmp_path, name, predictor, message):
    from tests.helpers import RegressionModel, hybrid_trainer, loader

    trainer, _ = hybrid_trainer(40, hybrid=hybrid_callbacks(predictor=predictor, bandit=False), logger=False)
    model = RegressionModel(scheduler=True)
    with pytest.raises((ValueError, MisconfigurationException), match=message):
        trainer.fit(model, loader(64, batch_size=32), ckpt_path=DATA / name)
    assert trainer.global_step == 0


@pytest.mark.parametrize("state_on_host", [False, True])
def test_a_last_jump_saved_before_the_rule_kept_the_weights_before_it_is_undone_the_same(state_on_host):
    """Checkpoints written before 2026-12-02 keep the default rule's last jump ``d``; the rule now keeps the weights
    before it. Loaded, ``d`` is saved again as it came until it is used; its undo takes it out of the weights and
    the anchor, as the rule that wrote it would have."""
    gen = torch.Generator().manual_seed(0)
    landed = [torch.randn(5, 3, generator=gen), torch.randn(4, generator=gen)]  # the anchor: where the jump landed
    rule = OuterMomentum(state_on_host=state_on_host)
    rule.setup(landed, keep_jump=True)
    jump = [torch.randn(t.shape, generator=gen) for t in landed]
    rule.load_state_dict({"b": [torch.zeros_like(t) for t in landed], "jump": jump})
    assert set(rule.state_dict()) == {"b", "jump"} and torch.equal(rule.state_dict()["jump"][1], jump[1])
    params, anchor = [t + 0.1 for t in landed], [t.clone() for t in landed]  # a few steps since the jump
    rule.undo(params, anchor)
    for p, a, t, d in zip(params, anchor, landed, jump):
        assert torch.allclose(a, t - d, atol=1e-6) and torch.allclose(p, t + 0.1 - d, atol=1e-6)
    assert set(rule.state_dict()) == {"b", "before_jump"}
