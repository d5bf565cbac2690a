"""The fused jump (:mod:`lightning_hybrid.predictors.outer_fused`) in a run: where it serves, every jump is made by
its kernels, the run makes the eager run's decisions with weights within float32 rounding's drift of its, and a
resumed run equals the uninterrupted one bitwise; where it does not serve (no CUDA, other dtypes, shards, kernels
that disagree with the eager path), the eager path runs, said once. Its kernels run on CUDA, or on a CPU in
Triton's interpreter; without Triton (as on CI) the tests that need them are skipped."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import hybrid_callbacks
from lightning_hybrid.predictors import OuterMomentum, fused_blocks, outer_fused
from tests.helpers import (
    DEFAULT_JUMPING,
    RULE_PHASES,
    NanAt,
    flat_params,
    hybrid_trainer,
    loader,
    scheduler_of,
)

NAN_AT = {23, 35}


def _fit(root, device, ckpt_path=None, save=False):
    extra = [ModelCheckpoint(root / "ckpt", "{step}", every_n_train_steps=20, save_top_k=-1)] if save else []
    rule = OuterMomentum(**DEFAULT_JUMPING)
    trainer, _ = hybrid_trainer(
        48,
        hybrid=hybrid_callbacks(predictor=rule, **RULE_PHASES),
        extra_callbacks=extra,
        logger=False,
        enable_checkpointing=save,
        default_root_dir=root,
        accelerator="gpu" if device == "cuda" else "cpu",
    )
    model = NanAt(NAN_AT)  # the steps after two jumps: judged, and undone
    trainer.fit(model, loader(64, batch_size=16), ckpt_path=ckpt_path)  # 4 steps an epoch
    return flat_params(model).cpu(), scheduler_of(trainer).summary()


def test_a_fused_run_makes_the_eager_runs_decisions_and_resumes_bitwise(tmp_path, fused_device, monkeypatch):
    weights = [torch.ones(3, device=fused_device)]  # checked before the jumps are counted
    assert outer_fused.usable([weights, weights, weights, weights], False, True)
    planned, fused_plan = [], outer_fused.plan
    monkeypatch.setattr(outer_fused, "plan", lambda *a, **k: planned.append(1) or fused_plan(*a, **k))
    fused, summary = _fit(tmp_path / "fused", fused_device, save=True)
    assert summary["jumps_made"] >= 4 and summary["jumps_undone"] >= 1
    assert len(planned) == summary["jumps_made"] + summary["momentum_restarts"]  # every jump by the kernels
    with monkeypatch.context() as eager:
        eager.setattr(fused_blocks, "DEVICE_TYPES", set())
        reference, reference_summary = _fit(tmp_path / "eager", fused_device)
    decisions = ("jumps_made", "jumps_kept", "jumps_undone", "momentum_restarts", "backward_passes")
    assert {k: summary[k] for k in decisions} == {k: reference_summary[k] for k in decisions}
    assert torch.allclose(fused, reference, rtol=1e-4, atol=1e-6)
    resumed, _ = _fit(tmp_path / "resumed", fused_device, ckpt_path=tmp_path / "fused" / "ckpt" / "step=20.ckpt")
    assert torch.equal(resumed, fused)


def test_the_eager_path_runs_where_the_fused_jump_does_not_serve(monkeypatch):
    weights = [torch.ones(3), torch.ones(2, 2)]
    assert not outer_fused.usable([weights, weights, [], []], False, True)  # on a CPU, Triton compiles nothing
    monkeypatch.setattr(fused_blocks, "DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(fused_blocks, "triton", fused_blocks.triton or object())
    monkeypatch.setattr(fused_blocks, "_checked", {("outer jump", torch.device("cpu"), (False, False, True)): True})
    assert outer_fused.usable([weights, weights, [], []], False, True)
    assert not outer_fused.usable([weights, weights, [], []], True, True)
    assert not outer_fused.usable([[w.double() for w in weights], weights, [], []], False, True)
    assert not outer_fused.usable([weights, [torch.ones(2, 2).t()], [], []], False, True)  # not contiguous
    assert not outer_fused.usable([[], [], [], []], False, True)


def test_kernels_that_fail_their_check_leave_the_jumps_eager_and_say_so_once(monkeypatch):
    def broken(device, *variant):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(fused_blocks, "DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(fused_blocks, "triton", fused_blocks.triton or object())
    monkeypatch.setattr(fused_blocks, "_checked", {})
    monkeypatch.setattr(outer_fused, "_agrees", broken)
    weights = [torch.ones(3)]
    with pytest.warns(UserWarning, match="fused outer jump is not used on cpu: it failed: RuntimeError: no such"):
        assert not outer_fused.usable([weights, weights, [], []], False, True)
    monkeypatch.setattr(outer_fused, "_agrees", lambda *args: pytest.fail("checked twice"))
    assert not outer_fused.usable([weights, weights, [], []], False, True)


@pytest.mark.parametrize("keep_norms", [True, False])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("has_b", [True, False])
def test_every_variant_of_the_kernels_makes_the_eager_jump(fused_device, has_b, keep, keep_norms):
    """With and without a momentum (``outer_momentum=0``), the weights kept (``verify_window=0``) and
    ``keep_norms``: the check each run makes before training, on tensors across a block's edge and of norms from
    1e-6 to 1e6."""
    assert outer_fused._agrees(torch.device(fused_device), has_b, keep, keep_norms)
