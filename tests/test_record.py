"""The run record and the deferred steps on their own: what is counted, logged, summarised and checkpointed, and
how quiet steps read at once come back in order."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from lightning_hybrid.engine import Deferred, RunRecord, StepRecord
from lightning_hybrid.engine import record as record_module
from lightning_hybrid.engine.deferred import read_all
from lightning_hybrid.phase import Phase
from lightning_hybrid.summary import RunCounters


def test_steps_are_counted_by_phase_with_their_time():
    record = RunRecord()
    for phase, backed_off in [(Phase.WARMUP, False), (Phase.FULL, True), (Phase.PREDICT, False)]:
        record.count_step(StepRecord(phase=phase, backed_off=backed_off), 0.5)
    counters = record.counters
    assert counters.steps_by_phase == {"warmup": 1, "full": 1, "predict": 1, "correct": 0}
    assert counters.time_by_phase_s["full"] == 0.5 and counters.backed_off_steps == 1


def test_every_step_logs_its_phase_and_loss_and_nan_where_it_has_none():
    """Lightning logs again a value it was given earlier: a scalar without a value is logged as ``nan``."""
    record = RunRecord()
    assert record.metrics(StepRecord(phase=Phase.FULL, loss=2.0)) == {"hybrid/phase": 1.0, "hybrid/loss": 2.0}
    unknown = record.metrics(StepRecord(phase=Phase.PREDICT))
    assert unknown["hybrid/phase"] == 2.0 and math.isnan(unknown["hybrid/loss"])


def test_the_record_round_trips_and_its_clock_goes_on_from_the_checkpoint(monkeypatch):
    now = [100.0]  # the record's clock, the test's own: seconds pass when the test says
    monkeypatch.setattr(record_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    record = RunRecord()
    record.counters.rollbacks, record.counters.jumps_made = 2, 3
    record.add_error(0.5)
    record.start_clock()
    now[0] += 2.0
    state = record.state_dict()
    again = RunRecord()
    again.load_state_dict(state)
    assert again.counters == record.counters and again.errors == record.errors
    now[0] += 5.0
    assert again.wall_time() == state["wall_time_s"] == 2.0  # stopped until training starts again
    again.start_clock()
    now[0] += 0.5
    assert again.wall_time() == 2.5
    assert again.mean_error() == 0.5
    assert again.summary((Phase.WARMUP, Phase.FULL))["steps_by_phase"] == {"warmup": 0, "full": 0}


def test_old_counter_keys_load_and_unknown_ones_are_ignored():
    counters = RunCounters()
    counters.load({"rollbacks": 4, "no_such_counter": 1})
    assert counters.rollbacks == 4 and not hasattr(counters, "no_such_counter")
    assert RunCounters(segments_started=2, jumps_made=3).predictions_made == 5


def _quiet(reading, tracked=None) -> Deferred:
    step = StepRecord(phase=Phase.FULL, quiet=True, reading=reading, delta_ready=tracked is not None)
    return Deferred(step, 7, 0.1, [0.01], tracked)


def test_quiet_steps_are_read_at_once_in_order():
    pending = [
        _quiet(torch.tensor([1.5, 2.0, 0.0, 0.0]), torch.tensor([[1.0, 2.0]])),
        _quiet(torch.tensor([math.nan, 3.0, 1.0, 0.0])),
        _quiet(torch.tensor([1.0, 99.0, 0.0, 1.0])),
        _quiet(None),  # the user skipped the batch
    ]
    counters = RunCounters()
    read_all(pending, counters)
    assert [(d.step.loss, d.step.skipped) for d in pending[:1]] == [(1.5, False)]
    assert pending[0].step.grad_norm == 2.0 and pending[0].tracked == [[1.0, 2.0]]
    assert [d.step.skipped for d in pending] == [False, True, True, True]
    assert counters.nonfinite_steps_skipped == 1 and counters.outlier_steps_skipped == 1


def test_quiet_steps_guarded_on_the_device_are_read_in_one_transfer_in_order():
    """The guard's device readings, ``([loss, each gradient's norm...], skipped)``, and what was tracked come back
    to each step: the whole norm taken on the host, a skip with finite values counted as an outlier."""
    pending = [
        _quiet((torch.tensor([1.5, 3.0, 4.0]), torch.tensor(0.0)), torch.tensor([[1.0, 2.0]])),
        _quiet((torch.tensor([1.0, 30.0, 40.0]), torch.tensor(1.0))),
        _quiet((torch.tensor([math.inf, 3.0, 4.0]), torch.tensor(1.0)), torch.tensor([5.0])),
    ]
    counters = RunCounters()
    read_all(pending, counters)
    assert [(d.step.loss, d.step.grad_norm, d.step.skipped) for d in pending[:2]] == [
        (1.5, 5.0, False),
        (1.0, 50.0, True),
    ]
    assert pending[2].step.skipped and [d.tracked for d in pending] == [[[1.0, 2.0]], None, [5.0]]
    assert counters.outlier_steps_skipped == 1 and counters.nonfinite_steps_skipped == 1


def test_a_quiet_step_round_trips_through_a_checkpoint():
    entry = _quiet(torch.tensor([1.5, 2.0, 0.0, 0.0]), torch.tensor([[1.0, 2.0]]))
    again = Deferred.from_dict(entry.to_dict())
    assert again.to_dict() == entry.to_dict()
    assert again.step.quiet and again.step.delta_ready and again.step.phase is Phase.FULL
