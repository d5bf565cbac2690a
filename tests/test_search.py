"""The ``search`` family: a probe-verified line search along the last update. Each verdict on a case whose answer
is known (how many repetitions a quadratic rewards, none at its minimum, none on a non-finite probe), its
schedule (searching less where it does not pay), and what a Lightning run sees: every backward pass kept, the
probe leaving no trace, exact resume, identical DDP ranks, settings refused by name."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_hybrid import hybrid_callbacks
from lightning_hybrid.predictors import LineSearch
from tests.helpers import RegressionModel, flat_params, hybrid_trainer, loader, scheduler_of

# ------------------------------------------------------------------------------------------------ the search itself


def _quadratic(w: torch.Tensor):
    return lambda: float(0.5 * (w - 3.0).square().sum())


def test_it_keeps_the_repetitions_a_quadratic_rewards_and_undoes_the_first_that_loses():
    """After an SGD step of lr 0.1 on 0.5 (w - 3)^2, the loss along the update is (1 - 0.1 t)^2 scaled: falling up
    to t = 10 (the minimum), rising after. From t = 1, nine repetitions are kept and the tenth is undone."""
    w = torch.zeros(4)
    update = [0.1 * (3.0 - w)]  # the step that took w from 0 to 0.3
    w += update[0]
    taken, before = LineSearch(max_steps=16).search([w], update, _quadratic(w))
    assert taken == 9 and before == pytest.approx(0.5 * 4 * 2.7**2)
    assert torch.allclose(w, torch.full((4,), 3.0))


def test_at_the_minimum_nothing_is_kept_and_the_weights_are_bitwise_untouched():
    w = torch.full((4,), 3.0) + torch.tensor([1e-3, -2e-3, 0.0, 5e-4])
    start = w.clone()
    taken, _ = LineSearch().search([w], [torch.tensor([0.5, 0.5, -0.5, 0.5])], _quadratic(w))
    assert taken == 0 and torch.equal(w, start)


def test_a_non_finite_probe_undoes_the_step():
    w = torch.zeros(3)
    losses = iter([1.0, math.nan])
    taken, _ = LineSearch().search([w], [torch.ones(3)], lambda: next(losses))
    assert taken == 0 and torch.equal(w, torch.zeros(3))


def test_a_search_keeps_at_most_max_steps_and_ends_on_the_last_kept_point():
    w = torch.zeros(2)
    taken, _ = LineSearch(max_steps=3).search([w], [torch.full((2,), 0.1)], lambda: float(-w.sum()))
    assert taken == 3 and torch.allclose(w, torch.full((2,), 0.3))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"every": 0}, "every"),
        ({"every": 8, "max_interval": 4}, "max_interval"),
        ({"max_steps": 0}, "max_steps"),
        ({"span": 0}, "span"),
        ({"every": 4, "span": 5}, "span"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        LineSearch(**kwargs)


# ------------------------------------------------------------------------------------------------ in a Lightning run


class LoggingRegression(RegressionModel):
    """Logs its training loss, as most modules do: the probe's evaluations must not show in the logs."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


def _searching(**settings):
    rule = LineSearch(**{"every": 4, "max_interval": 16, **settings})
    return hybrid_callbacks(predictor=rule, warmup_steps=5), rule


def test_it_searches_keeps_every_backward_pass_and_its_probe_leaves_no_trace():
    hybrid, _ = _searching()
    trainer, logger = hybrid_trainer(60, hybrid=hybrid)
    model = LoggingRegression(lr=1e-3)  # an under-tuned rate: repeating updates pays
    trainer.fit(model, loader())
    summary = scheduler_of(trainer).summary()
    assert summary["family"] == "search" and summary["searches"] >= 3 and summary["search_steps"] > 0
    assert model.backward_calls == 60 and summary["backward_skipped"] == 0
    assert model.training  # the probe ran in eval mode and put train mode back
    assert len(logger.series("train_loss")) == 60  # one logged loss per step: none from the probe's batches
    assert model.training_step_calls > 60  # ... which did run the module's training_step


def test_where_searching_does_not_pay_it_backs_off_to_its_longest_interval():
    hybrid, rule = _searching()
    trainer, _ = hybrid_trainer(80, hybrid=hybrid)
    trainer.fit(RegressionModel(lr=0.1), loader())  # a high rate: repeating an update overshoots
    engine = scheduler_of(trainer).engine
    counters = engine.record.counters
    assert counters.search_steps == 0 and counters.searches >= 3
    assert engine.family.interval == rule.max_interval  # 4, 8, 16: one search in 16 steps from then on


class BufferWatch(L.Callback):
    """After every step (the scheduler's hook has run): whether the store holds a parameter-sized buffer."""

    def __init__(self) -> None:
        self.held: list[bool] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.held.append(bool(scheduler_of(trainer).engine.store.buffer))


def test_outside_a_search_it_holds_no_parameter_copy(monkeypatch):
    hybrid, rule = _searching()
    during: list[int] = []
    search = rule.search

    def watched(params, direction, loss):
        during.append(len(direction))  # the update's buffer; the search adds one copy, its last kept point
        return search(params, direction, loss)

    monkeypatch.setattr(rule, "search", watched)
    watch = BufferWatch()
    trainer, _ = hybrid_trainer(60, hybrid=[*hybrid, watch])
    trainer.fit(LoggingRegression(lr=1e-3), loader())
    assert len(during) >= 3 and all(n == len(list(trainer.lightning_module.parameters())) for n in during)
    assert len(watch.held) == 60 and not any(watch.held)


class ParamsAtStart(L.Callback):
    """The weights as each step starts, by the global step."""

    def __init__(self) -> None:
        self.at: dict[int, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, *args) -> None:
        self.at[trainer.global_step] = flat_params(pl_module).clone()


def test_a_span_searches_along_the_mean_update_of_its_steps(monkeypatch):
    """With ``span=4``, each search's direction is (weights after the search step - weights 4 steps before) / 4:
    recorded from a search that keeps nothing, so that the weights at the next step's start are the span's end."""
    hybrid, rule = _searching(span=4)
    seen: list[tuple[int, torch.Tensor]] = []

    def recording(params, direction, loss):
        seen.append((scheduler_of(trainer).engine.global_step, torch.cat([d.reshape(-1) for d in direction]).clone()))
        return 0, loss()

    monkeypatch.setattr(rule, "search", recording)
    start = ParamsAtStart()
    trainer, _ = hybrid_trainer(60, hybrid=[*hybrid, start])
    trainer.fit(RegressionModel(lr=1e-2), loader())
    # search steps end at 10 (warmup 5 + every 4, spanning steps 6-9), then 8 and 16 steps after (nothing kept)
    assert [g for g, _ in seen][:3] == [10, 19, 36]
    for g, direction in seen:
        assert torch.allclose(direction, (start.at[g] - start.at[g - 4]) / 4, atol=1e-7), g


def test_a_span_pays_where_the_last_update_does_and_frees_its_copy_after_each_search():
    hybrid, _ = _searching(span=4)
    trainer, _ = hybrid_trainer(60, hybrid=hybrid)
    model = LoggingRegression(lr=1e-3)
    trainer.fit(model, loader())
    engine = scheduler_of(trainer).engine
    assert engine.record.counters.search_steps > 0 and model.backward_calls == 60
    assert engine.family.anchor is None or engine.global_step - engine.family.anchor_step < 4


def test_without_a_kept_step_the_run_is_plain_lightning_bitwise():
    hybrid, _ = _searching()
    trainer, _ = hybrid_trainer(40, hybrid=hybrid)
    model = RegressionModel(lr=0.1)
    trainer.fit(model, loader())
    assert scheduler_of(trainer).counters.search_steps == 0
    plain = RegressionModel(lr=0.1)
    L.Trainer(max_steps=40, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(plain, loader())
    assert torch.equal(flat_params(model), flat_params(plain))


def _checkpointed(root, ckpt_path=None, span=1):
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=2, filename="{step}")
    hybrid, _ = _searching(span=span)
    trainer, _ = hybrid_trainer(
        40,
        hybrid=hybrid,
        extra_callbacks=[checkpoint] if ckpt_path is None else [],
        enable_checkpointing=ckpt_path is None,
        logger=False,
        default_root_dir=root,
    )
    model = RegressionModel(lr=1e-3, scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)  # 2 steps an epoch
    return model, trainer


@pytest.mark.parametrize("span", [1, 4])
def test_resume_is_bitwise_exact_and_the_probe_is_in_the_checkpoint(tmp_path, span):
    """With a span, some checkpoints fall inside one: its start is held in them and restored."""
    model, trainer = _checkpointed(tmp_path / "full", span=span)
    assert scheduler_of(trainer).counters.search_steps > 0
    inside = []
    for step in (4, 8, 12, 14, 26):
        path = tmp_path / "full" / "ckpt" / f"step={step}.ckpt"
        state = next(v for k, v in torch.load(path, weights_only=True)["callbacks"].items() if "Scheduler" in k)
        assert len(state["probe"]["batches"]) == 1
        inside.append(state["family"]["anchor"] is not None)
        resumed, resumed_trainer = _checkpointed(tmp_path / f"resume{step}", path, span=span)
        assert torch.equal(flat_params(resumed), flat_params(model)), step
        assert (
            scheduler_of(resumed_trainer).summary()["search_steps"] == scheduler_of(trainer).summary()["search_steps"]
        )
    assert any(inside) == (span > 1) and not all(inside)


def test_batchnorm_statistics_are_untouched_by_the_probe():
    class Normed(RegressionModel):
        def __init__(self):
            super().__init__(lr=1e-3)
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))

    seen = []

    class Buffers(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen.append(int(pl_module.net[1].num_batches_tracked))

    hybrid, _ = _searching()
    trainer, _ = hybrid_trainer(30, hybrid=hybrid, extra_callbacks=[Buffers()])
    trainer.fit(Normed(), loader())
    assert scheduler_of(trainer).counters.searches > 0
    assert seen == list(range(1, 31))  # one batch counted per training step, none per probe evaluation


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["search", "search_span"])
def test_ddp_ranks_decide_alike_and_stay_identical(tmp_path, kind):
    from tests.test_ddp import run_ranks

    rank0, rank1 = run_ranks(tmp_path, kind)
    assert not torch.equal(rank0["first_batch"], rank1["first_batch"]), "ranks should see different data"
    assert torch.equal(rank0["params"], rank1["params"])
    assert rank0["summary"]["search_steps"] == rank1["summary"]["search_steps"] > 0


def test_manual_optimization_is_refused_by_name_before_training():
    """The probe runs the module's training_step, which under manual optimization would step the optimizer."""
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    hybrid, _ = _searching()
    trainer, _ = hybrid_trainer(10, hybrid=hybrid)
    model = RegressionModel(automatic=False)
    with pytest.raises(MisconfigurationException, match="predictor='search' evaluates its probe"):
        trainer.fit(model, loader())
    assert model.training_step_calls == 0
