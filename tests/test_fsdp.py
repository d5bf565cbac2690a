"""``hybrid_fsdp`` settings and errors, in one CPU process (the two-rank runs are in ``tests/test_ddp.py``)."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_hybrid import HybridFSDPStrategy, hybrid_callbacks
from lightning_hybrid.callbacks.base import STATE_VERSION
from lightning_hybrid.callbacks.sharded_state import PER_RANK, SLOT, unstow
from tests.golden import DATA, REL_TOL
from tests.helpers import (
    RegressionModel,
    flat_params,
    free_port,
    hybrid_trainer,
    loader,
    per_rank_entries,
    scheduler_of,
)

# the run that wrote tests/data/state_v3_fsdp_rank_file.ckpt (24 steps; its step 16, an epoch's end, a jump awaiting
# its verdict)
FSDP_FIXTURE = dict(warmup_steps=4, full_steps=5, verify_window=3, verify_resolution=0.0)


@pytest.fixture
def single_rank(monkeypatch):
    """A one-rank gloo group on loopback, torn down after the test."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"save_distributed_checkpoint": False}, "always saves sharded checkpoints"),
        ({"tensor_parallel_size": 2}, "shards over all ranks"),
        ({"auto_wrap_policy": {"Linear"}}, "auto_wrap_policy must hold torch.nn.Module classes"),
    ],
)
def test_bad_settings_are_refused_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HybridFSDPStrategy(**kwargs)


def _fsdp_trainer(tmp_path, steps, settings=None, **kwargs):
    return hybrid_trainer(
        steps,
        settings=settings,
        devices=1,
        strategy=HybridFSDPStrategy(process_group_backend="gloo", auto_wrap_policy={torch.nn.Linear}),
        default_root_dir=tmp_path,
        logger=False,
        **kwargs,
    )[0]


def test_offloading_the_optimizer_state_is_refused_before_training(tmp_path, single_rank):
    trainer = _fsdp_trainer(tmp_path, 10, {"predict_memory": "offload"})
    model = RegressionModel()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(
        MisconfigurationException, match=r"predict_memory=.offload. is not supported with a sharded strategy"
    ):
        trainer.fit(model, loader())
    assert trainer.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _saved(tmp_path, steps: int = 8, **kwargs):
    """A one-rank ``hybrid_fsdp`` fit that checkpoints at its last step: the checkpoint's folder."""
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=steps, filename="{step}")
    trainer = _fsdp_trainer(tmp_path, steps, extra_callbacks=[checkpoint], enable_checkpointing=True, **kwargs)
    trainer.fit(RegressionModel(), loader())
    return tmp_path / "ckpt" / f"step={steps}.ckpt"


def _this_ranks_states(saved, rank: int = 0) -> dict:
    """The hybrid callbacks' states of ``rank`` in a sharded checkpoint, as its resume reads them."""
    checkpoint = torch.load(saved / "meta.pt", weights_only=False)
    unstow(checkpoint, saved, rank)
    return checkpoint["callbacks"]


def test_each_ranks_hybrid_state_rides_inside_the_sharded_checkpoint(tmp_path, single_rank):
    """Rank 0's copy among the callbacks is a marker (with the flag a reader looks for); the state is the rank's
    own, inside the distributed checkpoint; a resume on a rank the checkpoint has no state of names the world
    size."""
    saved = _saved(tmp_path)
    assert per_rank_entries(saved) == ["optimizer_0.lightning_hybrid.rank0"] and not list(saved.glob("*rank*.pt"))
    marker = torch.load(saved / "meta.pt", weights_only=False)["callbacks"]["HybridScheduler"]
    assert marker == {PER_RANK: True, "unverified": False}
    states = _this_ranks_states(saved)
    assert states["HybridScheduler"]["version"] == STATE_VERSION and "DynamicsPredictor" in states
    with pytest.raises(RuntimeError, match=r"rank 1 from .*holds no state of that rank.*world size"):
        _this_ranks_states(saved, rank=1)


def test_the_per_step_mode_beside_a_strategy_that_is_not_hybrid_is_refused_naming_the_hybrid_ones(tmp_path):
    """The per-step mode predicts whole steps and owns their dispatch: beside a plain Lightning strategy it is
    refused before anything trains (the default rule and gpa run beside it: ``tests/test_any_strategy.py``)."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    trainer = hybrid_trainer(10, strategy=SingleDeviceStrategy("cpu"), default_root_dir=tmp_path)[0]
    with pytest.raises(MisconfigurationException, match=r"not SingleDeviceStrategy.*'hybrid'.*'hybrid_fsdp'"):
        trainer.fit(RegressionModel(), loader())
    assert trainer.global_step == 0


class _Payload:
    """What a tampered per-rank state could carry: unpickling it would run ``touch``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_per_rank_state_carrying_a_pickled_object_is_refused_not_run(tmp_path):
    """In the distributed checkpoint, or in the file per rank ``hybrid_fsdp`` wrote before: plain data only."""
    import io
    import shutil

    from torch.distributed.checkpoint import save

    marker = tmp_path / "executed"
    blob = io.BytesIO()
    torch.save({"HybridScheduler": {"extra": _Payload(str(marker))}}, blob)
    blob.seek(0)
    tampered = tmp_path / "tampered"
    save({"optimizer_0": {SLOT: {"rank0": blob}}}, checkpoint_id=tampered, no_dist=True)
    with pytest.raises(RuntimeError, match=r"Refusing to load .*tampered"):
        unstow({"callbacks": {"HybridScheduler": {PER_RANK: True}}}, tampered, 0)
    old = tmp_path / "old.ckpt"
    shutil.copytree(DATA / "state_v3_fsdp_rank_file.ckpt", old)
    state = torch.load(old / "hybrid_callbacks_rank0.pt", weights_only=True)  # the genuine state loads as plain data
    torch.save({**state, "extra": _Payload(str(marker))}, old / "hybrid_callbacks_rank0.pt")
    with pytest.raises(RuntimeError, match=r"Refusing to load .*hybrid_callbacks_rank0.pt.*tampered"):
        unstow(torch.load(old / "meta.pt", weights_only=False), old, 0)
    assert not marker.exists()


def test_a_checkpoint_hybrid_fsdp_wrote_with_a_file_per_rank_resumes_as_the_uninterrupted_run(tmp_path, single_rank):
    """Before 2026-12-07 ``hybrid_fsdp`` kept each rank's state in a file beside the shards (``tests/data``): the
    resume reads it, with the jump it holds awaiting its verdict, and ends as the run that never stopped."""
    runs = []
    for ckpt_path in (None, DATA / "state_v3_fsdp_rank_file.ckpt"):
        strategy = HybridFSDPStrategy(process_group_backend="gloo")
        trainer = hybrid_trainer(24, hybrid=hybrid_callbacks(**FSDP_FIXTURE), devices=1, strategy=strategy,
                                 logger=False, default_root_dir=tmp_path)[0]  # fmt: skip
        model = RegressionModel(scheduler=True)
        trainer.fit(model, loader(), ckpt_path=ckpt_path)
        runs.append((flat_params(model), scheduler_of(trainer).summary()))
    (whole, summary), (resumed, after) = runs
    assert after["jumps_made"] == summary["jumps_made"] >= 1
    assert [after[k] for k in ("jumps_kept", "jumps_undone")] == [summary[k] for k in ("jumps_kept", "jumps_undone")]
    torch.testing.assert_close(resumed, whole, rtol=REL_TOL, atol=0.0)  # the fixture's floats: another machine's


def test_the_plain_parent_shards_an_unchanged_module_without_the_hybrid_callbacks(tmp_path, single_rank):
    """``plain_fsdp`` is what the app runs as the plain baseline of ``hybrid_fsdp``."""
    import lightning as L
    from torch.distributed.tensor import DTensor

    from lightning_hybrid import FullyShardedStrategy
    from lightning_hybrid.runner import PLAIN_STRATEGY

    assert PLAIN_STRATEGY["hybrid_fsdp"] == FullyShardedStrategy.strategy_name == "plain_fsdp"
    model = RegressionModel()
    trainer = L.Trainer(
        max_steps=4, accelerator="cpu", devices=1, strategy="plain_fsdp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, loader())
    assert isinstance(trainer.strategy, FullyShardedStrategy) and trainer.global_step == 4
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert model.backward_calls == 4


def test_a_sharded_checkpoint_of_primal_averaging_holds_the_average(tmp_path, single_rank):
    """Written while training (the parameters at ``y``), the folder's weights are the rule's ``x``: the plugin puts
    the average in the checkpoint's sharded state dict, the parameters untouched."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from lightning_hybrid import hybrid_callbacks
    from lightning_hybrid.predictors import PrimalAveraging

    checkpoint = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=8, filename="{step}")
    trainer = hybrid_trainer(
        12, hybrid=hybrid_callbacks(predictor=PrimalAveraging(mu_x=0.9), warmup_steps=0), devices=1,
        strategy=HybridFSDPStrategy(process_group_backend="gloo"), default_root_dir=tmp_path, logger=False,
        extra_callbacks=[checkpoint], enable_checkpointing=True,
    )[0]  # fmt: skip
    trainer.fit(RegressionModel(), loader())
    saved = tmp_path / "ckpt" / "step=8.ckpt"
    dcp_to_torch_save(saved, tmp_path / "whole.pt")
    weights = list(torch.load(tmp_path / "whole.pt", weights_only=False)["state_dict"].values())
    states = _this_ranks_states(saved)
    average = next(v for k, v in states.items() if "DynamicsPredictor" in k)["predictor"]["x"]
    assert len(weights) == len(average) == 4
    assert all(torch.equal(w.flatten(), x.flatten()) for w, x in zip(weights, average))
    z = next(v for k, v in states.items() if "DynamicsPredictor" in k)["predictor"]["z"]
    assert not all(torch.equal(w.flatten(), t.flatten()) for w, t in zip(weights, z))  # not the other sequence
