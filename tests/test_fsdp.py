"""``hybrid_fsdp`` settings and errors, in one CPU process (the two-rank runs are in ``tests/test_ddp.py``)."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_hybrid import HybridFSDPStrategy
from tests.helpers import RegressionModel, free_port, hybrid_trainer, loader


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


def test_resuming_without_this_ranks_hybrid_state_names_the_missing_file(tmp_path, single_rank):
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=8, filename="{step}")
    trainer = _fsdp_trainer(tmp_path, 8, extra_callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(RegressionModel(), loader())
    saved = tmp_path / "ckpt" / "step=8.ckpt"
    (saved / "hybrid_callbacks_rank0.pt").unlink()
    trainer = _fsdp_trainer(tmp_path, 16)
    with pytest.raises(RuntimeError, match=r"rank 0 .*has no hybrid_callbacks_rank0.pt.*world size"):
        trainer.fit(RegressionModel(), loader(), ckpt_path=saved)


def test_the_per_step_mode_beside_a_strategy_that_is_not_hybrid_is_refused_naming_the_hybrid_ones(tmp_path):
    """The per-step mode predicts whole steps and owns their dispatch: beside a plain Lightning strategy it is
    refused before anything trains (the default rule and gpa run beside it: ``tests/test_any_strategy.py``)."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    trainer = hybrid_trainer(10, strategy=SingleDeviceStrategy("cpu"), default_root_dir=tmp_path)[0]
    with pytest.raises(MisconfigurationException, match=r"not SingleDeviceStrategy.*'hybrid'.*'hybrid_fsdp'"):
        trainer.fit(RegressionModel(), loader())
    assert trainer.global_step == 0


class _Payload:
    """What a tampered per-rank state file could carry: unpickling it would run ``touch``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_per_rank_state_file_carrying_a_pickled_object_is_refused_not_run(tmp_path, single_rank):
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=8, filename="{step}")
    trainer = _fsdp_trainer(tmp_path, 8, extra_callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(RegressionModel(), loader())
    saved = tmp_path / "ckpt" / "step=8.ckpt"
    state_file, marker = saved / "hybrid_callbacks_rank0.pt", tmp_path / "executed"
    state = torch.load(state_file, weights_only=True)  # the genuine state loads as plain data
    torch.save({**state, "extra": _Payload(str(marker))}, state_file)
    trainer = _fsdp_trainer(tmp_path, 16)
    with pytest.raises(RuntimeError, match=r"Refusing to load .*hybrid_callbacks_rank0.pt.*tampered"):
        trainer.fit(RegressionModel(), loader(), ckpt_path=saved)
    assert not marker.exists()


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
    """The sharded state dict's tensors are the parameters' own: written while the average is swapped in, the
    folder's weights are the rule's ``x`` (and training then goes on at ``y``)."""
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
    states = torch.load(saved / "hybrid_callbacks_rank0.pt", weights_only=True)
    average = next(v for k, v in states.items() if "DynamicsPredictor" in k)["predictor"]["x"]
    assert len(weights) == len(average) == 4
    assert all(torch.equal(w.flatten(), x.flatten()) for w, x in zip(weights, average))
    z = next(v for k, v in states.items() if "DynamicsPredictor" in k)["predictor"]["z"]
    assert not all(torch.equal(w.flatten(), t.flatten()) for w, t in zip(weights, z))  # not the other sequence
