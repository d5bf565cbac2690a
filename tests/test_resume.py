"""A run resumed from a checkpoint taken in any phase, mid-predict included, matches the uninterrupted run.

Checkpoints are taken after the last batch of an epoch (``every_n_train_steps`` = batches per epoch): those are
the checkpoints plain Lightning itself resumes from bitwise (mid-epoch it restarts a non-stateful dataloader from
the epoch's first batch, and ``every_n_epochs`` checkpoints were not exact for plain training either).
"""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import Phase
from tests.helpers import (
    RegressionModel,
    by_step,
    flat_params,
    hybrid_trainer,
    loader,
    plugin_state,
    resume_callbacks,
    scheduler_of,
    step_of,
)

STEPS = 40


def _run(root, ckpt_path=None, checkpoint_every_epoch=False, kind="linear", memory="none", capture="per_step"):
    extra = []
    if checkpoint_every_epoch:
        extra.append(ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=2, filename="{step}"))
    trainer, _ = hybrid_trainer(
        STEPS,
        hybrid=resume_callbacks(kind, memory, capture),
        extra_callbacks=extra,
        logger=False,
        enable_checkpointing=checkpoint_every_epoch,
        default_root_dir=root,
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)  # 2 steps per epoch
    return model, trainer


def _state(path):
    """The scheduler's state in a checkpoint: the phase machine's, the family's and the counters, side by side."""
    checkpoint = torch.load(path, weights_only=False)
    state = plugin_state(checkpoint)
    return {**state["machine"], **state["family"], "counters": state["record"]["counters"]}


def test_resume_from_every_phase_is_bitwise_exact(tmp_path):
    model, trainer = _run(tmp_path / "full", checkpoint_every_epoch=True)
    reference = flat_params(model)
    reference_summary = scheduler_of(trainer).summary()
    ckpts = by_step(tmp_path / "full" / "ckpt")
    by_phase = {}
    for path in ckpts:
        state = _state(path)
        phase = Phase(state["phase"])
        if phase is Phase.PREDICT and state["segment_pos"] == 0:
            continue  # a segment about to start; prefer checkpoints inside one
        by_phase.setdefault(phase, path)
    assert set(by_phase) == set(Phase), f"checkpoints cover only {sorted(by_phase)}"
    mid_predict = _state(by_phase[Phase.PREDICT])
    assert mid_predict["snapshot"] is not None
    assert 0 < mid_predict["segment_pos"] < len(mid_predict["plan"]["scales"])
    for phase, path in by_phase.items():
        resumed, resumed_trainer = _run(tmp_path / f"resume_{phase.name}", ckpt_path=path)
        assert torch.equal(flat_params(resumed), reference), f"resume from {phase.name} ({path.name}) diverged"
        summary = scheduler_of(resumed_trainer).summary()
        for key in ("steps_by_phase", "backward_passes", "rollbacks", "segments_started"):
            assert summary[key] == reference_summary[key], key


# the snapshot in the kept buffer, in host memory, in a buffer held only for the segment
@pytest.mark.parametrize("memory, capture", [("none", "kept"), ("aggressive", "per_step"), ("none", "per_step")])
def test_resume_mid_predict_then_roll_back_restores_the_checkpointed_snapshot(tmp_path, memory, capture):
    model, trainer = _run(
        tmp_path / "full", checkpoint_every_epoch=True, kind="exploding", memory=memory, capture=capture
    )
    reference = flat_params(model)
    assert scheduler_of(trainer).counters.rollbacks >= 2
    ckpts = by_step(tmp_path / "full" / "ckpt")
    states = [_state(p) for p in ckpts]
    # mid-segment checkpoints whose segment is rolled back within the next two steps: resuming uses their snapshot
    followed_by_rollback = [
        path
        for path, state, after in zip(ckpts, states, states[1:])
        if state["snapshot"] is not None
        and state["segment_pos"] > 0
        and after["counters"]["rollbacks"] > state["counters"]["rollbacks"]
    ]
    assert followed_by_rollback
    for path in followed_by_rollback:
        resumed, _ = _run(
            tmp_path / f"resume_{path.stem}", ckpt_path=path, kind="exploding", memory=memory, capture=capture
        )
        assert torch.equal(flat_params(resumed), reference), path.name


@pytest.mark.parametrize("kind", ["mlp", "rssm"])
def test_resume_with_a_learned_predictor_and_the_bandit_is_bitwise_exact(tmp_path, kind):
    model, trainer = _run(tmp_path / "full", checkpoint_every_epoch=True, kind=kind)
    reference = flat_params(model)
    scheduler = scheduler_of(trainer)
    assert scheduler.predictor.predictor.train_steps > 0
    assert sum(scheduler.bandit.horizons.counts) > 0
    assert scheduler.counters.steps_by_phase["predict"] > 0
    ckpts = {step_of(p): p for p in by_step(tmp_path / "full" / "ckpt")}
    mid_predict = [s for s, p in sorted(ckpts.items()) if _state(p)["snapshot"] is not None]
    for step in sorted({10, 24, *mid_predict[:1]}):
        resumed, _ = _run(tmp_path / f"resume_{step}", ckpt_path=ckpts[step], kind=kind)
        assert torch.equal(flat_params(resumed), reference), f"resume from step {step} diverged"
