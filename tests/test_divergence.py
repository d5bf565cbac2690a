"""Bad predictions are rolled back exactly, and non-finite losses never reach the weights."""

import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_hybrid import DivergenceMonitor, HorizonBandit, Phase, hybrid_callbacks
from lightning_hybrid.algorithms import DivergenceCheck
from lightning_hybrid.callbacks import DynamicsPredictor, HybridScheduler, ResidualCorrector
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.predictors import LinearPredictor, Plan
from tests.helpers import FAST_PHASES, NanAt, RegressionModel, flat_params, hybrid_trainer, loader, phases, scheduler_of


class ScaledPredictor(LinearPredictor):
    """The linear predictor with its planned steps multiplied by ``factor`` on selected segments."""

    def __init__(self, factor: float, every: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.factor, self.every, self.plans = factor, every, 0

    def plan(self, horizon: int, features=None) -> Plan:
        plan = super().plan(horizon, features)
        self.plans += 1
        if self.plans % self.every == 0:
            plan.scales = [[s * self.factor for s in row] for row in plan.scales]
        return plan


class NanDirectionPredictor(LinearPredictor):
    def directions(self):
        return [[torch.full_like(t, math.nan) for t in group] for group in super().directions()]


def _trainer(predictor, max_steps=60, config=None, extra=(), **kwargs):
    scheduler = HybridScheduler(config or HybridConfig(**FAST_PHASES))
    hybrid = [scheduler, DynamicsPredictor(predictor), ResidualCorrector(), DivergenceMonitor()]
    trainer, logger = hybrid_trainer(max_steps, hybrid=hybrid, extra_callbacks=list(extra), **kwargs)
    return trainer, logger, scheduler


class SegmentWatch(Callback):
    """Keeps the weights at the start of each Predict segment and right after each rollback."""

    def __init__(self):
        self.starts, self.after_rollback, self._rollbacks, self._prev = [], [], 0, None

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        scheduler = scheduler_of(trainer)
        if scheduler.phase is Phase.PREDICT and self._prev is not Phase.PREDICT:
            self.starts.append(flat_params(pl_module))
        self._prev = scheduler.phase

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        scheduler = scheduler_of(trainer)
        if scheduler.counters.rollbacks > self._rollbacks:
            self._rollbacks = scheduler.counters.rollbacks
            self.after_rollback.append((len(self.starts) - 1, flat_params(pl_module)))


def test_exploding_prediction_is_rolled_back_bitwise():
    watch = SegmentWatch()
    trainer, logger, scheduler = _trainer(ScaledPredictor(factor=1e4, every=2), extra=[watch])
    model = RegressionModel()
    trainer.fit(model, loader())
    assert scheduler.counters.rollbacks >= 2
    assert scheduler.counters.segments_accepted >= 1  # the unscaled segments still run
    for segment, weights in watch.after_rollback:
        assert torch.equal(weights, watch.starts[segment]), f"segment {segment} not restored exactly"
    assert scheduler.monitor.divergence.events["bound"] + scheduler.monitor.divergence.events["nonfinite"] >= 2
    assert torch.isfinite(flat_params(model)).all()
    seq = phases(logger)
    for step, phase in seq.items():  # a rollback returns to Full, never to Correct
        if phase is Phase.PREDICT and seq.get(step + 1) not in (Phase.PREDICT, Phase.CORRECT, None):
            assert seq[step + 1] is Phase.FULL


def test_segment_checked_only_at_the_first_correct_step_is_rolled_back_there():
    watch = SegmentWatch()
    config = HybridConfig(**{**FAST_PHASES, "predict_forward_every": 0})
    trainer, _logger, scheduler = _trainer(ScaledPredictor(factor=1e4, every=1), config=config, extra=[watch])
    model = RegressionModel()
    trainer.fit(model, loader())
    assert scheduler.counters.rollbacks >= 1
    for segment, weights in watch.after_rollback:
        assert torch.equal(weights, watch.starts[segment])
    # with no forward checks, every rolled-back segment ran to its horizon before the verification step
    assert scheduler.counters.predicted_steps_rolled_back == scheduler.counters.steps_by_phase["predict"]


def test_prediction_switches_off_after_consecutive_rollbacks():
    config = HybridConfig(**{**FAST_PHASES, "max_consecutive_rollbacks": 2})
    trainer, logger, scheduler = _trainer(ScaledPredictor(factor=1e4), config=config, max_steps=120)
    with pytest.warns(UserWarning, match="prediction is off"):
        trainer.fit(RegressionModel(), loader())
    assert scheduler.counters.rollbacks == 2
    summary = scheduler.summary()
    assert summary["prediction_disabled"] is True
    last_predict = max(s for s, p in phases(logger).items() if p is Phase.PREDICT)
    assert last_predict < 60  # the rest of the run is plain training
    # after each failure the horizon halves
    horizons = [v for v in logger.series("hybrid/horizon").values() if v > 0]
    assert max(horizons) == FAST_PHASES["max_predict_steps"]


def test_invalid_plan_is_refused_before_touching_the_weights():
    watch = SegmentWatch()
    config = HybridConfig(**{**FAST_PHASES, "max_consecutive_rollbacks": 3})
    trainer, _logger, scheduler = _trainer(NanDirectionPredictor(), config=config, extra=[watch])
    with pytest.warns(UserWarning, match="prediction is off"):
        trainer.fit(model := RegressionModel(), loader())
    assert scheduler.counters.invalid_plans == 3
    assert scheduler.counters.steps_by_phase["predict"] == 0
    assert torch.isfinite(flat_params(model)).all()


class _Before(Callback):
    def __init__(self):
        self.unchanged = {}

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        self.before = flat_params(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        self.unchanged[trainer.global_step - 1] = torch.equal(self.before, flat_params(pl_module))


def test_nan_loss_in_ordinary_steps_never_reaches_the_weights():
    before = _Before()
    trainer, _logger, scheduler = _trainer(LinearPredictor(), extra=[before])
    model = NanAt(steps={2, 7, 8})  # one warmup step and two full steps
    with pytest.warns(UserWarning, match="skipped the update") as said:
        trainer.fit(model, loader())
    assert scheduler.counters.nonfinite_steps_skipped == 3
    skips = [str(w.message) for w in said if "skipped the update" in str(w.message)]
    assert skips == [  # said as it happens, once a fit; the others counted
        "hybrid: skipped the update of step 3: its loss or gradient was not finite; the weights and the optimizer's "
        "state are as before it. Further skips in this fit are counted in its summary."
    ]
    assert before.unchanged[2] and before.unchanged[7] and before.unchanged[8]
    assert not before.unchanged[3]
    assert torch.isfinite(flat_params(model)).all()
    # Adam's moments never saw the bad step: its step counter equals the ordinary steps that updated
    adam_steps = int(trainer.optimizers[0].state[model.net[0].weight]["step"])
    ordinary = sum(v for k, v in scheduler.counters.steps_by_phase.items() if k != "predict")
    assert adam_steps == ordinary - 3


def test_nan_during_a_predict_forward_check_rolls_back():
    seq_trainer, seq_logger, _ = _trainer(LinearPredictor())
    seq_trainer.fit(RegressionModel(), loader())
    seq = phases(seq_logger)
    # second step of the first segment (a forward check runs there), as a 0-based global step
    first = min(s for s, p in seq.items() if p is Phase.PREDICT)
    watch = SegmentWatch()
    trainer, _logger, scheduler = _trainer(LinearPredictor(), extra=[watch])
    model = NanAt(steps={first})  # global_step during that step is `first`, i.e. logged step first + 1
    trainer.fit(model, loader())
    assert scheduler.monitor.divergence.events["nonfinite"] == 1
    assert scheduler.counters.rollbacks == 1
    assert torch.equal(watch.after_rollback[0][1], watch.starts[0])


def test_monitor_signals():
    monitor = DivergenceCheck(z_threshold=3.0, oscillation_window=3, oscillation_sigmas=1.0, stats_decay=0.9)
    for i in range(50):
        monitor.observe(1.0 + 0.1 * (-1) ** i, grad_norm=1.0)
    std = monitor.loss_stats.std
    assert 0.05 < std < 0.15
    monitor.start_segment()
    assert monitor.check(math.nan, upper_bound=10.0) == "nonfinite"
    assert monitor.check(math.inf, upper_bound=10.0) == "nonfinite"
    assert monitor.check(2.0, upper_bound=1.5) == "bound"
    assert monitor.check(1.0 + 5 * std, upper_bound=10.0) == "zscore"
    monitor.start_segment()
    assert monitor.check(1.0, 10.0) is None
    assert monitor.check(1.0 + 2 * std, 10.0) is None
    assert monitor.check(1.0, 10.0) is None
    assert monitor.check(1.0 + 2 * std, 10.0) == "oscillation"
    assert monitor.events == {"nonfinite": 2, "bound": 1, "zscore": 1, "oscillation": 1, "delayed": 0}
    monitor.start_segment()  # small alternations are noise, not oscillation
    for v in (1.0, 1.0 + 0.5 * std, 1.0, 1.0 + 0.5 * std, 1.0):
        assert monitor.check(v, 10.0) is None


def test_monitor_state_round_trips():
    monitor = DivergenceCheck()
    for i in range(10):
        monitor.observe(float(i), 1.0)
    monitor.check(math.nan, 1.0)
    clone = DivergenceCheck()
    clone.load_state_dict(monitor.state_dict())
    assert clone.state_dict() == monitor.state_dict()


def test_hybrid_callbacks_default_set_is_complete():
    kinds = {type(cb) for cb in hybrid_callbacks(predictor="linear")}
    assert kinds == {HybridScheduler, DynamicsPredictor, ResidualCorrector, DivergenceMonitor, HorizonBandit}
    assert HorizonBandit not in {type(cb) for cb in hybrid_callbacks(predictor="linear", bandit=False)}
    kinds = {type(cb) for cb in hybrid_callbacks()}  # the default rule corrects no plans and chooses no horizons
    assert kinds == {HybridScheduler, DynamicsPredictor, DivergenceMonitor}
