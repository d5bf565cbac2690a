"""The plugin as one callback, ``HybridScheduler``, beside the strategy the user already has: the whole plugin in
any mode from one object, trained under Lightning's own strategies as under the hybrid ones, refused by name where
it cannot serve, and every callback and strategy pickling and deep-copying before and after a fit (spawn launchers,
notebooks). The two-rank runs are in ``tests/test_ddp.py`` (env-launched) and below (launched by Lightning)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_hybrid import (
    DivergenceMonitor,
    DynamicsPredictor,
    FullyShardedStrategy,
    HorizonBandit,
    HybridDDPStrategy,
    HybridFSDPStrategy,
    HybridPredictStrategy,
    HybridScheduler,
    ResidualCorrector,
    hybrid_callbacks,
)
from lightning_hybrid.callbacks import HybridProgressBar, VRAMLogger
from lightning_hybrid.callbacks.wiring import check_strategy
from lightning_hybrid.phase import Phase
from tests.faults.common import FaultyModel, FiniteWatch
from tests.helpers import (
    BESIDE,
    FAST,
    ROOT,
    RULE_PHASES,
    RegressionModel,
    flat_params,
    free_port,
    hybrid_trainer,
    loader,
    scheduler_of,
    script_env,
    trained,
    users_trainer,
)


@pytest.mark.parametrize("rule", sorted(BESIDE))
def test_one_callback_beside_lightnings_strategy_trains_bitwise_as_the_hybrid_strategy(rule):
    """The default rule and gpa, as ``Trainer(callbacks=[HybridScheduler()])`` on Lightning's single-device
    strategy, and as the hybrid strategy with ``hybrid_callbacks``: the same weights, bitwise, and the same record;
    the user's strategy keeps its own class."""
    users = users_trainer([HybridScheduler(**BESIDE[rule])])
    model = RegressionModel(scheduler=True)
    users.fit(model, loader())
    hybrid, _ = hybrid_trainer(60, hybrid=hybrid_callbacks(**BESIDE[rule]), logger=False)
    reference = RegressionModel(scheduler=True)
    hybrid.fit(reference, loader())
    assert type(users.strategy) is SingleDeviceStrategy and "_hybrid" not in vars(users.strategy)
    assert torch.equal(flat_params(model), flat_params(reference))
    summary = scheduler_of(users).summary()
    assert trained(summary) == trained(scheduler_of(hybrid).summary())
    assert summary["backward_passes"] == 60  # every backward pass kept
    assert summary["jumps_made"] >= 1 if rule == "default" else summary["predictor"] == "gpa"


def test_the_guard_skips_a_non_finite_step_beside_the_users_strategy_as_under_the_hybrid_one():
    """A NaN loss and an exploding gradient in the Full phase: skipped beside Lightning's strategy exactly as under
    the hybrid strategy, and no non-finite value reaches the weights."""
    faults = {(Phase.FULL, 2): "nan", (Phase.FULL, 9): "explosion"}
    runs = []
    for trainer in (
        users_trainer([HybridScheduler(**BESIDE["default"]), FiniteWatch()]),
        hybrid_trainer(60, hybrid=hybrid_callbacks(**BESIDE["default"]), extra_callbacks=[FiniteWatch()])[0],
    ):
        model = FaultyModel(faults, scheduler=True)
        trainer.fit(model, loader())
        watch = next(cb for cb in trainer.callbacks if isinstance(cb, FiniteWatch))
        runs.append((flat_params(model), scheduler_of(trainer).summary(), watch.all_finite, len(model.injected)))
    (users, summary, finite, injected), (hybrid, reference, *_) = runs
    assert injected == 2 and finite and torch.equal(users, hybrid)
    assert summary["nonfinite_steps_skipped"] == reference["nonfinite_steps_skipped"] == 1
    assert summary["outlier_steps_skipped"] == reference["outlier_steps_skipped"] >= 1


def test_the_scheduler_alone_is_the_whole_plugin_in_any_mode():
    """``HybridScheduler(predictor="linear", ...)`` brings the per-step mode's components and trains as
    ``hybrid_callbacks`` with the same arguments; one setting of each component routed to it."""
    settings = {**FAST, "bandit": True, "z_threshold": 2.5, "max_residuals": 7, "feature_dim": 32}
    alone = HybridScheduler(**settings)
    kinds = [type(c) for c in alone.components]
    assert kinds == [DynamicsPredictor, DivergenceMonitor, ResidualCorrector, HorizonBandit]
    trainer, _ = hybrid_trainer(60, hybrid=[alone], logger=False)
    model = RegressionModel()
    trainer.fit(model, loader())
    reference_trainer, _ = hybrid_trainer(60, hybrid=hybrid_callbacks(**settings), logger=False)
    reference = RegressionModel()
    reference_trainer.fit(reference, loader())
    assert trainer.callbacks[0] is alone and not any(type(c) in kinds for c in trainer.callbacks)  # held, not placed
    assert alone.monitor.divergence.z_threshold == 2.5 and alone.components[2].correction.max_residuals == 7
    assert torch.equal(flat_params(model), flat_params(reference))
    assert alone.summary()["steps_by_phase"]["predict"] > 0
    assert trained(alone.summary()) == trained(scheduler_of(reference_trainer).summary())


def test_what_one_callback_cannot_serve_is_refused_by_name_before_training():
    """The per-step mode owns each step's dispatch: beside a strategy of the user's it is refused, naming the hybrid
    strategies. DeepSpeed and FSDP1 are refused by name; settings given for a component also listed are refused."""
    trainer = users_trainer([HybridScheduler(**FAST)])
    with pytest.raises(MisconfigurationException, match=r"runs the per-step mode.*not SingleDeviceStrategy.*'hybrid'"):
        trainer.fit(RegressionModel(), loader())
    assert trainer.global_step == 0 and type(trainer.strategy) is SingleDeviceStrategy
    with pytest.raises(MisconfigurationException, match=r"beside DeepSpeedStrategy: DeepSpeed's engine owns"):
        check_strategy(DeepSpeedStrategy.__new__(DeepSpeedStrategy), None)  # DeepSpeed itself not needed
    with pytest.raises(MisconfigurationException, match=r"beside FSDPStrategy: .* rank 0's callbacks only"):
        check_strategy(FSDPStrategy(), None)
    whole = ModelParallelStrategy(save_distributed_checkpoint=False)
    with pytest.raises(MisconfigurationException, match=r"ModelParallelStrategy\(save_distributed_checkpoint=False\)"):
        check_strategy(whole, None)
    assert check_strategy(ModelParallelStrategy(), None) and not check_strategy(DDPStrategy(), None)  # sharded?
    trainer = users_trainer([HybridScheduler(z_threshold=2.0), DivergenceMonitor()])
    with pytest.raises(MisconfigurationException, match=r"given \['z_threshold'\].*also lists a DivergenceMonitor"):
        trainer.fit(RegressionModel(), loader())


def test_a_component_without_the_scheduler_names_it():
    trainer = users_trainer([DivergenceMonitor()])
    with pytest.raises(MisconfigurationException, match=r"DivergenceMonitor is a component of the HybridScheduler"):
        trainer.fit(RegressionModel(), loader())


def test_a_hydra_callbacks_dict_takes_the_whole_plugin_as_one_target():
    """lightning-hydra-template instantiates each entry of its ``callbacks`` dict as one callback, then the Trainer
    with them (``instantiate(cfg.trainer, callbacks=...)``): one entry is the plugin, a rule one more key;
    ``hybrid_callbacks`` there (a list) is refused in one line naming the class, on either path to the Trainer."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    entry = {"_target_": "lightning_hybrid.HybridScheduler", "predictor": "gpa", **RULE_PHASES}
    config = OmegaConf.create({"callbacks": {"hybrid": entry}, "trainer": {"_target_": "lightning.Trainer"}})
    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer = instantiate(config.trainer, callbacks=[instantiate(c) for c in config.callbacks.values()],
                          max_steps=20, accelerator="cpu", **quiet)  # fmt: skip
    trainer.fit(RegressionModel(), loader())
    assert scheduler_of(trainer).summary()["predictor"] == "gpa"
    config.callbacks.hybrid = {"_target_": "lightning_hybrid.hybrid_callbacks"}
    said = r"lightning_hybrid.hybrid_callbacks returns a list.*HybridScheduler`"
    with pytest.raises(TypeError, match="^" + said):
        users_trainer([instantiate(c) for c in config.callbacks.values()])
    with pytest.raises(InstantiationException, match=said):  # Hydra's own words around the plugin's line
        instantiate(config.trainer, callbacks=[instantiate(c) for c in config.callbacks.values()], **quiet)


def _everything() -> list:
    """Every callback of every mode, and every strategy."""
    modes = [hybrid_callbacks(**BESIDE["default"]), hybrid_callbacks(predictor="gpa"), hybrid_callbacks(**FAST)]
    strategies = [HybridPredictStrategy(), HybridDDPStrategy(), HybridFSDPStrategy(), FullyShardedStrategy()]
    return [*modes, [VRAMLogger(), HybridProgressBar()], strategies]


def _copies(things: list) -> None:
    for thing in things:
        pickle.loads(pickle.dumps(thing))
        copy.deepcopy(thing)


def test_every_callback_and_strategy_pickles_and_deep_copies_before_and_after_a_fit():
    """No closure or lambda in anything a Trainer holds of the plugin's: spawn launchers pickle it, notebooks and
    tuners deep-copy it. After a fit beside the user's strategy, that strategy too."""
    _copies(_everything())
    for strategy in (HybridPredictStrategy, SingleDeviceStrategy):
        for callbacks in (hybrid_callbacks(**BESIDE["default"]), hybrid_callbacks(predictor="gpa")):
            trainer = users_trainer([*callbacks, VRAMLogger()], 20, strategy=strategy("cpu"))
            trainer.fit(RegressionModel(), loader())
            _copies([trainer.callbacks, trainer.strategy])
    trainer, _ = hybrid_trainer(40, hybrid=[HybridScheduler(**FAST)], logger=False)
    trainer.fit(RegressionModel(), loader())
    _copies([trainer.callbacks, trainer.strategy])


@pytest.mark.slow
def test_lightnings_own_launchers_run_the_callback_alone_on_two_ranks_and_resume_bitwise(tmp_path):
    """``strategy="ddp"`` in a ``lightning`` Trainer (Lightning starts the second rank as a process of the script)
    and ``"ddp_spawn"`` in a Trainer of the standalone ``pytorch_lightning`` (it spawns both, pickling the callback
    in), each with ``Trainer(callbacks=[HybridScheduler()])``: the ranks train and jump, end with bitwise equal
    weights, and a resume from step 32 ends bitwise as the uninterrupted run; the strategy is Lightning's own."""
    procs = {}
    for launcher, package in (("ddp", "lightning"), ("ddp_spawn", "pytorch_lightning")):
        env = script_env(MASTER_PORT=str(free_port()))
        cmd = [sys.executable, "-m", "tests.launched_ranks", launcher, package, str(tmp_path / launcher)]
        procs[launcher] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for launcher, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out.decode()[-3000:]
        load = {f: [torch.load(tmp_path / launcher / f"{f}-rank{r}.pt") for r in (0, 1)] for f in ("full", "resumed")}
        full, resumed = load["full"], load["resumed"]
        assert torch.equal(full[0]["params"], full[1]["params"]), launcher
        assert all(run["strategy"] == DDPStrategy.__name__ for run in full + resumed), launcher
        assert full[0]["summary"]["jumps_made"] >= 1 and full[0]["summary"]["backward_passes"] == 48
        for before, after in zip(full, resumed, strict=True):
            assert torch.equal(after["params"], before["params"]), launcher
            assert trained(after["summary"]) == trained(before["summary"]), launcher
