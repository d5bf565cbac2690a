"""What the plugin costs when it has little to do. Steps with nothing to learn (prediction off, backed off,
gated) cost no host read per step when the optimizer can be told on the device to skip an update (torch's fused
optimizers, a gradient scaler). They are still guarded, and the engine learns from them later, exactly as if each
had been read at once. While tracking, ``observe_every`` captures one update in k."""

import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_hybrid
from lightning_hybrid import DynamicsPredictor, Phase, hybrid_callbacks
from lightning_hybrid.engine.guard import StepGuard
from lightning_hybrid.predictors import OuterMomentum
from tests.faults.common import FaultyModel
from tests.helpers import (
    FAST,
    RULE,
    UNGUARDED,
    RegressionModel,
    flat_params,
    hybrid_trainer,
    loader,
    phases,
    scheduler_of,
)

PACKAGE = str(Path(lightning_hybrid.__file__).parent)
HOST_READS = ("item", "tolist", "__float__", "__bool__", "__int__")
OUTER = {"predictor": "outer", **RULE, **UNGUARDED}  # the mechanism, without the guards


class HostReads(L.Callback):
    """Counts, per optimizer step, the tensor-to-host reads made by the plugin's own code (on CUDA, each is a
    device synchronisation); Lightning's and the test's reads are not counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.step = 0
        self.by_step: dict[int, int] = {}
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def read(tensor, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(PACKAGE):
                self.by_step[self.step] = self.by_step.get(self.step, 0) + 1
            return original(tensor, *args, **kwargs)

        return read

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step = trainer.global_step + 1  # the step this batch makes


def _run(settings, steps=40, model=None, callbacks=(), **trainer_kwargs):
    trainer, _ = hybrid_trainer(steps, settings, extra_callbacks=list(callbacks), **trainer_kwargs)
    model = model if model is not None else FaultyModel(optimizer="fused_adam")
    trainer.fit(model, loader())
    return model, trainer


def test_quiet_steps_read_nothing_until_the_logs_need_it(monkeypatch):
    reads = HostReads(monkeypatch)
    _run({"enable_prediction": False}, callbacks=[reads], log_every_n_steps=50)
    assert set(reads.by_step) == set(range(6, 41, 6)) | {40}  # once per Full cycle (6 steps), and at the end


def test_logging_steps_read_what_they_log(monkeypatch):
    reads = HostReads(monkeypatch)
    _run({"enable_prediction": False, "full_steps": 50}, callbacks=[reads], log_every_n_steps=10)
    assert set(reads.by_step) == {10, 20, 30, 40}


@pytest.mark.parametrize("every", [1, 7])
def test_hybrid_scalars_follow_the_trainers_logging_cadence(every):
    trainer, logger = hybrid_trainer(40, {}, log_every_n_steps=every)
    trainer.fit(FaultyModel(optimizer="fused_adam"), loader())
    hybrid_keys = {key for _, metrics in logger.rows for key in metrics if key.startswith("hybrid/")}
    assert {"hybrid/phase", "hybrid/loss", "hybrid/backward_skipped_pct"} <= hybrid_keys
    logging_steps = {s - 1 for s in range(every, 41, every)}  # the module's own `self.log` steps
    assert set(logger.series("hybrid/phase")) == logging_steps
    for key in hybrid_keys:  # some scalars only where they have a value (a prediction error needs a prediction)
        assert set(logger.series(key)) <= logging_steps, key


def test_without_a_device_skip_every_step_is_read(monkeypatch):
    """Adam without ``fused=True`` cannot be told on the device to skip: each step is read before its update."""
    reads = HostReads(monkeypatch)
    _run({"enable_prediction": False}, model=FaultyModel(), callbacks=[reads], log_every_n_steps=10)
    assert set(reads.by_step) == set(range(1, 41))


def _host_read_run(monkeypatch, settings, faults, steps=40):
    """The same run with every quiet step read at once (the device skip disabled)."""
    with monkeypatch.context() as patch:
        patch.setattr(StepGuard, "skips_on_device", lambda self, optimizer: False)
        return _run(settings, steps, FaultyModel(faults, optimizer="fused_adam"))


@pytest.mark.parametrize(
    "settings",
    [{"enable_prediction": False}, {"confidence_threshold": 1.0, "backoff_after": 1}],
    ids=["prediction-off", "backed-off"],
)
def test_quiet_steps_skip_faults_on_the_device_as_the_host_path_does(monkeypatch, settings):
    """A NaN loss and an exploding gradient on quiet steps are skipped on the device: same weights, counters and
    statistics, bitwise, as when every step is read before its update."""
    faults = {(Phase.FULL, 20): "nan", (Phase.FULL, 45): "explosion"}  # both inside back-off pauses
    with pytest.warns(UserWarning, match="skipped the update") as quiet_said:
        model, trainer = _run(settings, 60, FaultyModel(faults, optimizer="fused_adam"), log_every_n_steps=50)
    with pytest.warns(UserWarning, match="skipped the update") as host_said:
        host_model, host_trainer = _host_read_run(monkeypatch, settings, faults, steps=60)
    said = [[str(w.message) for w in ws if "skipped the update" in str(w.message)] for ws in (quiet_said, host_said)]
    assert said[0] == said[1] and len(said[0]) == 1 and "not finite" in said[0][0]  # the step named as read
    quiet = scheduler_of(trainer)
    summary, host = quiet.summary(), scheduler_of(host_trainer).summary()
    assert [kind for *_, kind in model.injected] == ["nan", "explosion"]
    assert summary["backed_off_steps"] >= 36
    assert (summary["nonfinite_steps_skipped"], summary["outlier_steps_skipped"]) == (1, 1)
    assert {k: v for k, v in summary.items() if "time" not in k} == {k: v for k, v in host.items() if "time" not in k}
    assert torch.isfinite(flat_params(model)).all()
    assert torch.equal(flat_params(model), flat_params(host_model))
    assert quiet.monitor.state_dict() == scheduler_of(host_trainer).monitor.state_dict()


def test_a_skipped_quiet_step_leaves_weights_and_optimizer_state_untouched():
    class Watch(L.Callback):
        """Weights and optimizer state around every step: ``before[g]`` as step ``g`` starts, ``after[g]`` as it
        ends."""

        def __init__(self) -> None:
            self.before, self.after = {}, {}

        def _take(self, trainer, pl_module):
            states = [{k: v.clone() for k, v in s.items()} for s in trainer.optimizers[0].state.values()]
            return flat_params(pl_module), states

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.before[trainer.global_step] = self._take(trainer, pl_module)

        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            self.after[trainer.global_step - 1] = self._take(trainer, pl_module)
            assert not hasattr(trainer.optimizers[0], "found_inf")  # handed back after the step

    watch, model = Watch(), FaultyModel({(Phase.FULL, 10): "inf"}, optimizer="fused_adam")
    _run({"enable_prediction": False}, 20, model, [watch])
    ((step, _, _),) = model.injected
    (params, states), (params_after, states_after) = watch.before[step], watch.after[step]
    assert torch.equal(params, params_after)
    for state, state_after in zip(states, states_after, strict=True):
        assert all(torch.equal(state[k], state_after[k]) for k in state)  # the step count too
    assert not torch.equal(watch.before[step + 1][0], watch.after[step + 1][0])  # the next step trains again


@pytest.mark.parametrize(
    ("settings", "at"),
    [
        ({"confidence_threshold": 1.0, "backoff_after": 1, "full_steps": 5}, 48),
        ({}, 32),
        (OUTER, 32),
    ],
    ids=["backed-off", "predicting", "outer"],
)
def test_resume_with_quiet_steps_not_yet_read_is_bitwise_exact(tmp_path, settings, at):
    """A checkpoint between two reads holds the unread steps (and, while tracking, the predictor's statistics of
    their updates); the resumed run learns from them as the uninterrupted one does."""
    ckpt = ModelCheckpoint(tmp_path, every_n_train_steps=8, save_top_k=-1, filename="{step}")  # epoch ends
    model, trainer = _run(settings, 60, callbacks=[ckpt], enable_checkpointing=True, log_every_n_steps=100)
    state = torch.load(tmp_path / f"step={at}.ckpt", weights_only=False)
    (engine_state,) = [v for k, v in state["callbacks"].items() if k.startswith("HybridScheduler")]
    assert engine_state.get("deferred"), "the checkpoint must fall between two reads"
    tracking = any(d["tracked"] is not None for d in engine_state["deferred"])
    assert tracking == (not settings)
    resumed_model = FaultyModel(optimizer="fused_adam")
    resumed = hybrid_trainer(60, settings, log_every_n_steps=100)[0]
    resumed.fit(resumed_model, loader(), ckpt_path=tmp_path / f"step={at}.ckpt")
    assert torch.equal(flat_params(resumed_model), flat_params(model))
    assert scheduler_of(resumed).monitor.state_dict() == scheduler_of(trainer).monitor.state_dict()
    summary, resumed_summary = scheduler_of(trainer).summary(), scheduler_of(resumed).summary()
    assert {k: v for k, v in summary.items() if "time" not in k} == {
        k: v for k, v in resumed_summary.items() if "time" not in k
    }


class SyncDebug(L.Callback):
    """Errors on any device synchronisation during the steps ``quiet(trainer)`` picks (on CUDA); records them."""

    def __init__(self, quiet) -> None:
        self.quiet, self.checked = quiet, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        on = self.quiet(trainer)
        if on:
            self.checked.append(trainer.global_step + 1)  # the step this batch makes
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("error" if on else 0)

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(0)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.on_train_batch_end(trainer, pl_module)  # Lightning's teardown moves the optimizer to the host


def quiet_steps(settings):
    """The steps that must read nothing: quiet, and not the one step in ``full_steps`` whose end reads the quiet
    steps' values in one transfer (so that the outlier limit stays recent); predicting or jumping, also neither the
    first step of a Full cycle (a segment's verdict, or a jump's) nor its last (the cycle's end)."""

    def quiet(trainer) -> bool:
        engine = scheduler_of(trainer).engine
        if len(engine.deferred) >= engine.config.full_steps - 1:  # this step's end reads the batch
            return False
        if trainer.global_step + 1 == trainer.max_steps:  # the end of fit reads what is left
            return False
        if settings.get("enable_prediction", True):
            machine = engine.machine
            return machine.phase is Phase.FULL and 0 < machine.phase_step < machine.full_steps - 1
        return 5 <= trainer.global_step < 25

    return quiet


QUIET_SETTINGS = pytest.mark.parametrize(
    "settings",
    [{"enable_prediction": False}, {}, OUTER],
    ids=["off", "predicting", "outer"],
)


@QUIET_SETTINGS
def test_the_steps_the_cuda_sync_check_watches_read_nothing_on_the_cpu(monkeypatch, settings):
    """The CUDA test below, on the CPU: the plugin makes no host read in the steps it watches, and they are many."""
    reads, sync = HostReads(monkeypatch), SyncDebug(quiet_steps(settings))
    _run(settings, callbacks=[reads, sync], log_every_n_steps=100)
    assert len(sync.checked) >= 8
    assert not set(sync.checked) & set(reads.by_step), (sync.checked, reads.by_step)


@pytest.mark.gpu  # proves that quiet steps never synchronise
@QUIET_SETTINGS
def test_quiet_steps_never_synchronise_on_cuda(settings):
    sync = SyncDebug(quiet_steps(settings))
    model = FaultyModel({(Phase.FULL, 8): "nan"}, optimizer="fused_adam")
    trainer, _ = hybrid_trainer(
        40, settings, extra_callbacks=[sync], accelerator="cuda", devices=1, log_every_n_steps=100
    )
    trainer.fit(model, loader())
    assert len(sync.checked) >= 8
    assert scheduler_of(trainer).summary()["nonfinite_steps_skipped"] == 1
    assert math.isfinite(float(flat_params(model).sum()))


def test_a_gradient_scaler_with_a_fused_optimizer_keeps_its_own_skip_on_quiet_steps(monkeypatch):
    """The scaler hands a fused step its ``grad_scale`` and ``found_inf`` and takes them back after the step;
    the plugin must leave them to it (found on a GPU under ``16-mixed``: the scaler's ``del`` failed)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    plugin = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    model = FaultyModel({(Phase.FULL, 8): "nan"}, optimizer="fused_adam")
    trainer, _ = hybrid_trainer(40, {"enable_prediction": False}, plugins=[plugin], logger=False)
    guarded_on_device: list[int] = []
    original = StepGuard.check_on_device

    def counting(guard, *args, **kwargs):
        guarded_on_device.append(trainer.global_step)
        return original(guard, *args, **kwargs)

    monkeypatch.setattr(StepGuard, "check_on_device", counting)
    trainer.fit(model, loader())
    assert len(guarded_on_device) > 20 and trainer.global_step == 40
    assert scheduler_of(trainer).summary()["nonfinite_steps_skipped"] == 1  # the scaler skipped it, and we saw it
    assert math.isfinite(float(flat_params(model).sum()))


def test_observe_every_captures_one_update_in_k_and_still_predicts():
    trainer, logger = hybrid_trainer(80, {"observe_every": 3, "min_observations": 3})
    predictor = next(cb for cb in trainer.callbacks if isinstance(cb, DynamicsPredictor)).predictor
    observed: list[tuple[int, bool]] = []
    observe = predictor.observe

    def spy(step, loss, deltas, features=None):
        observed.append((step, deltas is not None))
        return observe(step, loss, deltas, features)

    predictor.observe = spy
    trainer.fit(RegressionModel(), loader())
    captured = [step for step, with_delta in observed if with_delta]
    assert captured and all((step - 1) % 3 == 0 for step in captured)  # the step began at a multiple of 3
    assert len(observed) > 2 * len(captured)  # the other ordinary steps still feed the loss trend
    assert Phase.PREDICT in phases(logger).values()


class PhaseWatch(L.Callback):
    """The phase each step ran in, without a logger (logging steps read everything)."""

    def __init__(self) -> None:
        self.by_step: dict[int, Phase] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.by_step[trainer.global_step + 1] = scheduler_of(trainer).phase


def test_tracking_steps_are_read_once_per_cycle(monkeypatch):
    """While the predictor learns (Warmup, Full, Correct), its observation is folded in on the device and read at
    the cycle's end, with the steps before it; only Predict segments and their verdict read on their own steps."""
    reads, watch = HostReads(monkeypatch), PhaseWatch()
    _run({}, 60, FaultyModel(optimizer="fused_adam"), [reads, watch], log_every_n_steps=100)
    phase = watch.by_step
    assert Phase.PREDICT in phase.values()
    inside = [s for s in phase if phase[s] is Phase.FULL and phase.get(s - 1) is phase.get(s + 1) is Phase.FULL]
    assert len(inside) >= 12 and not any(reads.by_step.get(s) for s in inside)  # a Full cycle's steps read nothing
    cycle_ends = [s for s in phase if phase[s] is Phase.FULL and phase.get(s + 1) is Phase.PREDICT]
    assert all(reads.by_step.get(s) for s in cycle_ends)  # its last step reads them all, before the decision


def test_quiet_tracking_learns_exactly_what_reading_every_step_learns(monkeypatch):
    """A predicting run whose ordinary steps are read once per cycle: same phases, weights, statistics and summary,
    bitwise, as the run that reads every step, with a NaN and an exploding gradient among the tracked steps."""
    faults = {(Phase.FULL, 9): "nan", (Phase.FULL, 20): "explosion"}
    runs = []
    for device_skip in (True, False):
        with monkeypatch.context() as patch:
            if not device_skip:
                patch.setattr(StepGuard, "skips_on_device", lambda self, optimizer: False)
            watch = PhaseWatch()
            model, trainer = _run({}, 70, FaultyModel(faults, optimizer="fused_adam"), [watch], log_every_n_steps=100)
            runs.append((model, scheduler_of(trainer), watch.by_step))
    (quiet_model, quiet, quiet_phases), (host_model, host, host_phases) = runs
    assert [kind for *_, kind in quiet_model.injected] == ["nan", "explosion"]
    assert quiet_phases == host_phases and Phase.PREDICT in quiet_phases.values()
    assert torch.equal(flat_params(quiet_model), flat_params(host_model))
    strip = lambda summary: {k: v for k, v in summary.items() if "time" not in k}  # noqa: E731
    assert strip(quiet.summary()) == strip(host.summary())
    assert quiet.summary()["nonfinite_steps_skipped"] == quiet.summary()["outlier_steps_skipped"] == 1
    assert quiet.monitor.state_dict() == host.monitor.state_dict()
    quiet_predictor, host_predictor = quiet.predictor.predictor.state_dict(), host.predictor.predictor.state_dict()
    assert torch.equal(
        torch.cat([t.flatten() for g in quiet_predictor["avg"] for t in g]),
        torch.cat([t.flatten() for g in host_predictor["avg"] for t in g]),
    )


def test_outer_reads_its_cycle_ends_and_the_step_after_each_jump_only(monkeypatch):
    """``outer`` keeps every backward pass and judges a jump on the step after it: that step is read before its
    update; the others are quiet, read with the cycle's end (where the jump is decided)."""
    reads, jumped = HostReads(monkeypatch), []
    jump = OuterMomentum.jump
    monkeypatch.setattr(
        OuterMomentum, "jump", lambda rule, *args, **kw: (jumped.append(reads.step), jump(rule, *args, **kw))[1]
    )
    trainer, _ = hybrid_trainer(
        40, hybrid=[reads, *hybrid_callbacks(**{**FAST, **OUTER, "bandit": False})], log_every_n_steps=100
    )  # `reads` first: it knows the step before the engine starts it
    trainer.fit(FaultyModel(optimizer="fused_adam"), loader())
    cycle_ends = set(range(11, 41, 6))  # 5 warmup steps, then Full cycles of 6
    assert jumped == [12, 18, 24, 30]  # none after the cycle ending at 35: its verdict would come after step 40
    # step 6 reads the 6 steps since the start (the warmup's end decides nothing): the outlier limit stays recent
    assert set(reads.by_step) == {6} | cycle_ends | set(jumped) | {40}


def test_quiet_outer_steps_judge_jumps_exactly_as_reading_every_step_does(monkeypatch):
    """The same ``outer`` run, read once per cycle and read at every step: same weights, jumps, verdicts,
    statistics and summary, bitwise, with a NaN on the step after a jump (rejected) and a NaN and an exploding gradient
    among the quiet steps."""
    faults = {(Phase.FULL, 13): "nan", (Phase.FULL, 20): "nan", (Phase.FULL, 33): "explosion"}  # step 18: a jump
    runs = []
    for device_skip in (True, False):
        with monkeypatch.context() as patch:
            if not device_skip:
                patch.setattr(StepGuard, "skips_on_device", lambda self, optimizer: False)
            model, trainer = _run(OUTER, 60, FaultyModel(faults, optimizer="fused_adam"), log_every_n_steps=100)
            runs.append((model, scheduler_of(trainer)))
    (quiet_model, quiet), (host_model, host) = runs
    assert [kind for *_, kind in quiet_model.injected] == ["nan", "nan", "explosion"]
    summary = quiet.summary()
    assert summary["jumps_made"] >= 5 and summary["jumps_undone"] >= 1
    assert summary["nonfinite_steps_skipped"] == summary["outlier_steps_skipped"] == 1
    strip = lambda summary: {k: v for k, v in summary.items() if "time" not in k}  # noqa: E731
    assert strip(summary) == strip(host.summary())
    assert torch.equal(flat_params(quiet_model), flat_params(host_model))
    assert quiet.monitor.state_dict() == host.monitor.state_dict()
