"""A checkpoint saved inside an epoch resumes the uninterrupted run only where the training loader can take up where
it was: the plugin says when it cannot, once a fit, and is silent where it can. Why a ``StatefulDataLoader`` on
several ranks cannot, as Lightning shards it, and what the plugin's strategies make of it (the two-rank runs are in
``tests/test_ddp.py``)."""

import warnings
from itertools import islice

import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler, StatefulDistributedSampler

from lightning_hybrid.callbacks.resumable import why_not_resumable
from lightning_hybrid.samplers import one_permutation
from tests.helpers import RegressionModel, flat_params, hybrid_trainer, regression_data

SAID = "falls inside an epoch"


def _fit(root, loader, every, ckpt_path=None):
    """20 steps of 8 batches an epoch, checkpointed every ``every`` steps; the weights and what was warned."""
    checkpoint = ModelCheckpoint(root, every_n_train_steps=every, save_top_k=-1, filename="{step}")
    trainer, _ = hybrid_trainer(20, extra_callbacks=[checkpoint], enable_checkpointing=True, logger=False)
    model = RegressionModel()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer.fit(model, loader, ckpt_path=ckpt_path)
    return flat_params(model), [str(w.message) for w in said if SAID in str(w.message)]


def test_a_shuffled_dataloader_checkpointed_inside_an_epoch_is_said_once_and_does_not_resume_exactly(tmp_path):
    shuffled = DataLoader(regression_data(256, 1), batch_size=32, shuffle=True)
    reference, said = _fit(tmp_path / "full", shuffled, every=3)
    assert len(said) == 1 and "step 3 " in said[0] and "DataLoader) has no state_dict" in said[0]
    assert "StatefulDataLoader" in said[0] and "epoch ends" in said[0]
    resumed, _ = _fit(tmp_path / "resumed", shuffled, every=3, ckpt_path=tmp_path / "full" / "step=3.ckpt")
    assert not torch.equal(resumed, reference)  # what it said: other batches after the resume


def test_the_checkpoint_lightning_saves_as_max_steps_ends_an_epoch_early_is_said_of_only_if_resumed(tmp_path):
    """A short run's end (20 steps of 8-batch epochs) is saved inside an epoch by Lightning's own checkpointing: said
    of on every short run, the warning was noise. Nothing is said when it is saved; a fit that resumes it for more
    steps hears Lightning's own warning as it starts."""
    shuffled = DataLoader(regression_data(256, 1), batch_size=32, shuffle=True)

    def fit(steps, ckpt_path=None):
        trainer, _ = hybrid_trainer(steps, enable_checkpointing=True, logger=False, default_root_dir=tmp_path)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer.fit(RegressionModel(), shuffled, ckpt_path=ckpt_path)
        return [str(w.message) for w in said], trainer.checkpoint_callback.best_model_path

    said, saved = fit(20)
    assert saved.endswith("step=20.ckpt") and not [m for m in said if SAID in m or "resuming from" in m]
    said, _ = fit(30, ckpt_path=saved)
    assert [m for m in said if "resuming from a checkpoint that ended before the epoch ended" in m]


def test_checkpoints_at_epoch_ends_or_from_a_stateful_loader_resume_exactly_and_nothing_is_said(tmp_path):
    shuffled = DataLoader(regression_data(256, 1), batch_size=32, shuffle=True)
    reference, said = _fit(tmp_path / "epochs", shuffled, every=8)
    assert said == []
    stateful = StatefulDataLoader(regression_data(256, 1), batch_size=32, shuffle=True)
    torch.manual_seed(0)
    reference, said = _fit(tmp_path / "full", stateful, every=3)
    assert said == []
    torch.manual_seed(1)  # another process's random state: the loader's saved state holds its order
    resumed, _ = _fit(tmp_path / "resumed", stateful, every=3, ckpt_path=tmp_path / "full" / "step=3.ckpt")
    assert torch.equal(resumed, reference)


def _resumed(make, seed):
    """Three batches of a new loader's epoch and five more, then five from a loader built anew in another process's
    random state (``seed``) that loaded the state saved after the first three."""
    torch.manual_seed(0)
    loader = make()
    batches = iter(loader)
    head = [next(batches).tolist() for _ in range(3)]
    state = loader.state_dict()
    tail = [next(batches).tolist() for _ in range(5)]
    torch.manual_seed(seed)
    again = make()
    again.load_state_dict(state)
    return tail, list(map(torch.Tensor.tolist, islice(again, 5))), why_not_resumable(loader), head


def test_why_a_stateful_loader_sharded_by_lightning_resumes_elsewhere():
    """What Lightning builds on rank 0 of 2 from ``StatefulDataLoader(data, shuffle=True)``: torchdata's
    ``RandomSampler`` inside Lightning's ``DistributedSamplerWrapper``, which is not stateful and draws the epoch's
    order from the process's random state. The loader saves how many indices it handed out, and a resume skips as
    many of a new order. torchdata's ``StatefulDistributedSampler`` orders by seed and epoch, and resumes."""
    data = torch.arange(64)  # 8 batches of 4 a rank

    def sharded():
        return StatefulDataLoader(data, batch_size=4, sampler=DistributedSamplerWrapper(RandomSampler(data), 2, 0))

    tail, resumed, why, _ = _resumed(sharded, seed=1)
    assert resumed != tail and "DistributedSamplerWrapper" in why and "StatefulDataLoader" in why

    def own_sampler():
        return StatefulDataLoader(data, batch_size=4, sampler=StatefulDistributedSampler(data, 2, 0, seed=3))

    tail, resumed, why, head = _resumed(own_sampler, seed=1)
    assert resumed == tail and why is None
    assert len({i for batch in head + tail for i in batch}) == 32  # rank 0's half of the epoch, each index once


def test_the_plugins_strategies_give_a_shuffled_stateful_loader_one_permutation_sharded():
    """What ``hybrid_ddp`` and ``hybrid_fsdp`` make of Lightning's loader for rank 0 and 1 of 2: torchdata's
    ``StatefulDistributedSampler`` with Lightning's seed, so the ranks' shards are disjoint, cover the data, and
    resume; a sampler of the user's own stays in Lightning's wrapper."""
    data = torch.arange(64)

    def lightnings(rank: int, sampler=None) -> StatefulDataLoader:
        inner = sampler or RandomSampler(data)
        wrapper = DistributedSamplerWrapper(inner, num_replicas=2, rank=rank, seed=7)
        return StatefulDataLoader(data, batch_size=4, sampler=wrapper)

    ours = [one_permutation(lightnings(rank)) for rank in (0, 1)]
    drawn = [loader.batch_sampler.sampler for loader in ours]  # torchdata's batch sampler, rebuilt around it
    assert all(type(sampler) is StatefulDistributedSampler and sampler.seed == 7 for sampler in drawn)
    shards = [{i for batch in loader for i in batch.tolist()} for loader in ours]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(64))
    tail, resumed, why, _ = _resumed(lambda: one_permutation(lightnings(0)), seed=1)
    assert resumed == tail and why is None
    own = lightnings(0, sampler=list(range(64)))  # any other sampler: as Lightning made it
    assert one_permutation(own) is own


def test_beside_the_users_strategy_a_shuffled_stateful_loader_on_several_ranks_is_said_to_keep_lightnings_sampler():
    """The one thing the plugin as one callback does not bring to the user's strategy: said in one line, naming
    the strategies that bring it; a loader that loses nothing, or one rank, says nothing."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    from lightning_hybrid.callbacks.wiring import what_it_goes_without

    data = torch.arange(64)
    wrapped = StatefulDataLoader(data, batch_size=4, sampler=DistributedSamplerWrapper(RandomSampler(data), 2, 0))
    trainer = SimpleNamespace(world_size=2, train_dataloader=wrapped, strategy=DDPStrategy())
    said = what_it_goes_without(trainer)
    assert said.startswith("hybrid: beside DDPStrategy, the shuffled StatefulDataLoader") and "'hybrid_ddp'" in said
    assert what_it_goes_without(SimpleNamespace(world_size=1, train_dataloader=wrapped, strategy=DDPStrategy())) is None
    plain = StatefulDataLoader(data, batch_size=4)
    assert what_it_goes_without(SimpleNamespace(world_size=2, train_dataloader=plain, strategy=DDPStrategy())) is None
