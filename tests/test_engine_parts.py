"""The engine's pure parts, and the whole engine stepped by a plain torch loop, without a Trainer."""

import pytest
import torch
from torch import nn

from lightning_hybrid import HybridConfig, Phase
from lightning_hybrid.engine import Due, HybridEngine, PhaseMachine, PredictionPolicy
from lightning_hybrid.engine.policy import LEARNING_RATE, PAUSED, SWITCHED_OFF
from lightning_hybrid.predictors import LinearPredictor
from tests.helpers import FAST_PHASES, bare_engine, bare_step

# ------------------------------------------------------------------------------------------------ PhaseMachine


def run_machine(machine: PhaseMachine, steps: int, backed_off=lambda i: False, accept=True) -> list[tuple]:
    """Drive the machine as the engine would, starting a segment of the current horizon at every cycle end."""
    trace, length = [], 0
    for i in range(steps):
        phase = machine.phase
        if phase is Phase.PREDICT:
            machine.segment_pos += 1
        due = machine.step_done(phase, backed_off(i), length)
        if due is Due.CYCLE_END and accept:
            length = machine.horizon
            machine.start_segment()
        trace.append((phase, due))
    return trace


def test_the_cycle_runs_warmup_full_predict_correct_full():
    machine = PhaseMachine(warmup_steps=2, full_steps=3, correction_steps=2, max_predict_steps=4)
    phases = [p.label[0] for p, _ in run_machine(machine, 16)]
    assert "".join(phases) == "wwfffppppccfffpp"


def test_a_declined_cycle_end_starts_another_full_cycle():
    machine = PhaseMachine(warmup_steps=0, full_steps=2, correction_steps=1, max_predict_steps=4)
    trace = run_machine(machine, 6, accept=False)
    assert [d for _, d in trace] == [None, Due.CYCLE_END] * 3
    assert machine.phase is Phase.FULL and machine.phase_step == 0


def test_backed_off_full_steps_never_complete_a_cycle():
    machine = PhaseMachine(warmup_steps=0, full_steps=2, correction_steps=1, max_predict_steps=4)
    assert all(d is None for _, d in run_machine(machine, 10, backed_off=lambda i: True))


def test_a_step_whose_phase_changed_while_it_ran_is_not_counted():
    machine = PhaseMachine(warmup_steps=0, full_steps=3, correction_steps=2, max_predict_steps=4)
    machine.start_segment()
    machine.enter(Phase.CORRECT)
    machine.enter(Phase.FULL)  # a rollback during a Correct step
    machine.step_done(Phase.CORRECT, False, 4)
    assert machine.phase is Phase.FULL and machine.phase_step == 0


def test_the_horizon_halves_on_failure_and_doubles_back_on_success():
    machine = PhaseMachine(warmup_steps=0, full_steps=1, correction_steps=1, max_predict_steps=8)
    seen = []
    for outcome in ["fail", "fail", "fail", "fail", "ok", "ok", "ok", "ok"]:
        machine.segment_failed() if outcome == "fail" else machine.segment_accepted()
        seen.append(machine.horizon)
    assert seen == [4, 2, 1, 1, 2, 4, 8, 8]


# ------------------------------------------------------------------------------------------------ PredictionPolicy


def test_back_off_pauses_double_until_a_segment_is_accepted():
    policy = PredictionPolicy(HybridConfig(full_steps=10, backoff_after=2, predict_lr_fraction=1.0))
    policy.start([1.0])
    policy.decline(10)
    assert policy.backed_off(11, lambda: [1.0]) is None  # one declined cycle: still observing
    policy.decline(20)
    assert policy.backed_off(21, lambda: [1.0]) == PAUSED and policy.backoff_until == 30
    assert not policy.backed_off(30, lambda: [1.0])
    policy.decline(40)  # the first declined cycle after a pause starts the next, twice as long
    assert policy.backoff_until == 60
    policy.prediction_accepted()
    policy.decline(70)
    assert not policy.backed_off(71, lambda: [1.0])  # accepted: back to `backoff_after` declines before a pause


def test_the_learning_rate_gate_opens_once_every_group_has_decayed():
    policy = PredictionPolicy(HybridConfig(predict_lr_fraction=0.5))
    policy.start([1.0, 0.1])
    assert policy.backed_off(0, lambda: [1.0, 0.1])
    policy.track_peak([2.0, 0.1])  # a warmup raises the first group's peak
    assert policy.lr_peak == [2.0, 0.1]
    assert policy.backed_off(0, lambda: [0.9, 0.06]) == LEARNING_RATE  # first group at 45% of its peak, second 60%
    assert not policy.backed_off(0, lambda: [0.9, 0.05])  # both at or below half their peak
    assert not PredictionPolicy(HybridConfig(predict_lr_fraction=1.0)).backed_off(0, lambda: [5.0])


def test_repeated_failures_switch_prediction_off_once():
    policy = PredictionPolicy(HybridConfig(max_consecutive_rollbacks=3, predict_lr_fraction=1.0))
    policy.start([1.0])
    assert [policy.prediction_failed() for _ in range(5)] == [False, False, True, False, False]
    assert policy.backed_off(0, lambda: [1.0]) == SWITCHED_OFF
    assert PredictionPolicy(HybridConfig(enable_prediction=False)).backed_off(0, lambda: []) == SWITCHED_OFF


# ------------------------------------------------------------------------------------------------ HybridEngine


def plain_torch_run(config: HybridConfig, steps: int, predictor=None):
    """A torch loop that hands every step to the engine, as the hybrid strategy and scheduler do in Lightning."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    engine = bare_engine(config, predictor or LinearPredictor(), optimizer)
    backward = {phase: 0 for phase in Phase}

    def loss_fn():
        loss = nn.functional.mse_loss(model(x), y)
        if loss.requires_grad:  # count the backward passes that really run
            loss.register_hook(lambda grad, phase=engine.phase: backward.__setitem__(phase, backward[phase] + 1))
        return loss

    trace = []
    for step in range(1, steps + 1):
        phase = engine.phase
        before = [p.detach().clone() for p in model.parameters()]
        bare_step(engine, optimizer, loss_fn, step)
        moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        trace.append((phase, moved))
    return engine, backward, trace


def test_the_engine_runs_every_phase_without_a_trainer():
    engine, backward, trace = plain_torch_run(HybridConfig(**FAST_PHASES, predict_forward_every=0), 40)
    counters = engine.record.counters
    assert backward[Phase.PREDICT] == 0
    assert counters.backward_passes == sum(backward.values()) == 40 - counters.steps_by_phase["predict"]
    assert counters.steps_by_phase["predict"] > 0 and counters.segments_accepted > 0
    assert all(moved for phase, moved in trace if phase is Phase.PREDICT)  # predicted updates move the weights
    assert {phase for phase, _ in trace} == set(Phase)


def test_the_engine_rolls_back_a_diverging_segment_without_a_trainer():
    class Exploding(LinearPredictor):
        def plan(self, horizon, features=None):
            plan = super().plan(horizon, features)
            plan.scales = [[s * 1e4 for s in row] for row in plan.scales]
            return plan

    config = HybridConfig(
        **{**FAST_PHASES, "max_predict_steps": 2}, predict_forward_every=0, max_consecutive_rollbacks=2
    )
    engine, _, _ = plain_torch_run(config, 40, Exploding())
    counters = engine.record.counters
    assert counters.rollbacks == 2 and engine.policy.prediction_off
    assert engine.summary()["rollback_reasons"]["bound"] == 2


def test_engine_state_round_trips_through_its_state_dict():
    config = HybridConfig(warmup_steps=2, full_steps=3, confidence_threshold=0.0, predict_lr_fraction=1.0)
    engine, _, _ = plain_torch_run(config, 17)
    clone = HybridEngine(config)
    clone.connect(engine.parts)
    clone.load_state_dict(engine.state_dict())
    want, got = engine.state_dict(), clone.state_dict()
    assert want["machine"]["phase"] == int(engine.phase)
    for part in ("machine", "policy"):
        assert got[part] == want[part], part
    assert got["record"]["counters"] == want["record"]["counters"]  # the source's clock runs on
    assert got["family"]["plan"] == want["family"]["plan"] and got["family"]["lr_ref"] == want["family"]["lr_ref"]


@pytest.mark.parametrize("bad", [{"full_steps": 0}, {"max_predict_steps": 0}])
def test_the_engine_takes_only_a_validated_config(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        HybridEngine(HybridConfig(**bad))


def test_the_run_meter_says_when_a_loss_was_first_reached():
    from lightning_hybrid import RunMeter

    meter = RunMeter()
    meter.validations = [(10, 1.0, 1.5, 2.5), (20, 2.0, 3.0, 1.9), (30, 3.0, 4.5, 2.1), (40, 4.0, 6.0, 1.5)]
    assert meter.first_reached(2.0) == (20, 2.0, 3.0) and meter.first_reached(1.5) == (40, 4.0, 6.0)
    assert meter.first_reached(1.0) is None
    again = RunMeter()
    again.load_state_dict(meter.state_dict())
    assert again.validations == meter.validations
    again.load_state_dict({**meter.state_dict(), "validations": [[10, 1.0, 2.5]]})  # kept no CPU seconds
    assert again.validations[0][::3] == (10, 2.5) and again.validations[0][2] != again.validations[0][2]
