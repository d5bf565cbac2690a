"""``OuterMomentum(state_on_host=True)``: the outer momentum and the last jump live in host memory and reach the
device only at a cycle's end. The run is the same, bitwise; between cycle ends the rule holds no device tensor.
The path is the one CUDA takes, with copies instead of transfers (on CUDA: pinned memory and a side stream)."""

import lightning as L
import pytest
import torch

from lightning_hybrid import Phase, hybrid_callbacks
from lightning_hybrid.offload import HostHeld
from lightning_hybrid.predictors import OuterMomentum
from tests.faults.common import FaultyModel
from tests.helpers import RULE_PHASES, RULE_VERDICT, flat_params, hybrid_trainer, loader, scheduler_of


def test_host_held_tensors_reach_the_device_only_while_in_use_and_come_back_only_when_written():
    like = [torch.ones(3), torch.ones(2, 2)]
    held = HostHeld(like)
    assert not held.held and all(torch.equal(h, torch.zeros_like(h)) for h in held.host)
    on_device = held.on_device()
    assert held.held and all(d.data_ptr() != h.data_ptr() for d, h in zip(on_device, held.host))  # copies
    on_device[0].fill_(5.0)  # read, not declared written: the host keeps its values
    held.put_away()
    assert not held.held and torch.equal(held.host[0], torch.zeros(3))
    fresh = held.on_device(fill=False)  # room for values about to be written: copied back
    torch._foreach_copy_(fresh, like)
    assert [torch.equal(v, t) for v, t in zip(held.values(), like)] == [True, True]  # while held: the device's
    held.put_away()
    assert all(torch.equal(h, t) for h, t in zip(held.host, like))
    held.on_device(write=True)[1].mul_(3.0)
    held.put_away()
    assert torch.equal(held.host[1], torch.full((2, 2), 3.0))
    held.on_device()
    held.zero_()  # drops the device copies
    assert not held.held and all(torch.equal(h, torch.zeros_like(h)) for h in held.host)
    held.on_device()
    held.drop()  # the host tensors may now be written directly (a checkpoint's values)
    assert not held.held
    held.host[0].fill_(2.0)
    assert torch.equal(held.values()[0], torch.full((3,), 2.0))


class HeldWatch(L.Callback):
    """After every step: whether any of the rule's host-held tensors is on the device, whether a jump is due, and
    the rule's own device lists."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, bool, bool, int]] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        engine = scheduler_of(trainer).engine
        rule = engine.parts.predictor
        held = any(h.held for h in rule._held.values())
        self.rows.append(
            (trainer.global_step, held, engine.family.state.jump_due, len(rule._b) + len(rule._before_jump))
        )


def _run(on_host: bool, faults: dict) -> tuple:
    watch = HeldWatch()
    rule = OuterMomentum(keep_norms=True, restart=True, alignment_window=3, state_on_host=on_host, **RULE_VERDICT)
    trainer, _ = hybrid_trainer(60, hybrid=hybrid_callbacks(predictor=rule, **RULE_PHASES), extra_callbacks=[watch])
    model = FaultyModel(faults)
    trainer.fit(model, loader())
    return model, scheduler_of(trainer), rule, watch


def test_state_on_host_makes_the_same_run_bitwise_and_holds_nothing_on_the_device_between_cycle_ends():
    faults = {(Phase.FULL, 13): "nan"}  # the step after the jump at step 18: judged, rejected, undone
    (model, scheduler, rule, _), (host_model, host_scheduler, host_rule, watch) = (
        _run(False, faults),
        _run(True, faults),
    )
    summary = host_scheduler.summary()
    assert summary["jumps_made"] >= 4 and summary["jumps_undone"] >= 1
    strip = lambda summary: {k: v for k, v in summary.items() if "time" not in k and k != "settings"}  # noqa: E731
    assert strip(summary) == strip(scheduler.summary())
    assert summary["settings"] == {**scheduler.summary()["settings"], "state_on_host": True}
    assert torch.equal(flat_params(host_model), flat_params(model))
    for name in ("b", "before_jump"):
        assert all(
            torch.equal(x, y) for x, y in zip(host_rule.state_dict()[name], rule.state_dict()[name], strict=True)
        )
    assert not any(device_lists for *_, device_lists in watch.rows)  # b and the jump: only in the host-held copies
    held_at = [step for step, held, _, _ in watch.rows if held]
    due_at = [step for step, _, due, _ in watch.rows if due]
    assert held_at and set(held_at) <= set(due_at)  # from a cycle's end that decided a jump, to that jump


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_jumps_with_state_on_host_match_jumps_without_on_every_device(device):
    """The rule alone, over a few cycles: restart's test, jumps with ``keep_norms``, an undo; on CUDA through pinned
    memory and the side stream (the GPU command runs this test), on the CPU through copies."""
    made = []
    for on_host in (False, True):
        rule = OuterMomentum(keep_norms=True, restart=True, state_on_host=on_host)
        params = [
            torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(device),
            torch.ones(8, 8, device=device),
        ]
        anchor = [t.clone() for t in params]
        rule.setup(params, keep_jump=True)
        steps = torch.Generator().manual_seed(1)
        for _ in range(5):
            drift = [(0.01 * torch.randn(t.shape, generator=steps) - 0.02).to(device) for t in params]
            torch._foreach_add_(params, drift)  # one way on the whole: no restart
            rule.jump(params, anchor)
        state = rule.state_dict()  # b and the last jump, before the undo resets b
        rule.undo(params, anchor)
        made.append((params, anchor, state, rule))
    (params, anchor, state, _), (host_params, host_anchor, host_state, host_rule) = made
    assert all(torch.equal(x, y) for x, y in zip([*params, *anchor], [*host_params, *host_anchor], strict=True))
    for name in ("b", "before_jump"):
        assert all(torch.equal(x, y) for x, y in zip(state[name], host_state[name], strict=True))
        assert any(t.abs().sum() > 0 for t in state[name])
    assert not any(held.held for held in host_rule._held.values())
    assert all(held.host[0].is_pinned() == (device == "cuda") for held in host_rule._held.values())


@pytest.mark.parametrize("device", DEVICES)
def test_the_default_keeps_the_state_on_the_device_and_goes_to_the_host_only_where_it_would_crowd_cuda(
    device, monkeypatch
):
    """``state_on_host=None``, the default: the momentum and the last jump stay on the device (no copy in or out a
    cycle); on CUDA, where those two copies would take more than half the free memory, they wait on the host."""
    rule = OuterMomentum()
    assert rule.state_on_host is None
    params = [torch.ones(4, device=device)]
    rule.setup(params, keep_jump=True)
    assert not rule._held and (len(rule._b), len(rule._before_jump)) == (1, 1) and not rule.held_on_host
    if device == "cuda":  # 2 copies of 16 bytes against 60 bytes free: more than half
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60, 10**9))
        crowded = OuterMomentum()
        crowded.setup(params, keep_jump=True)
        assert set(crowded._held) == {"b", "before_jump"} and crowded.held_on_host
    with pytest.raises(ValueError, match="state_on_host"):
        OuterMomentum(state_on_host="auto")


def test_a_run_whose_state_would_crowd_the_device_holds_it_on_the_host_and_says_so(monkeypatch, caplog):
    """The fallback, forced on a CPU: the run is the same bitwise as with the state on the device, and says where
    the state went and how to keep it on the device."""
    import lightning_hybrid.predictors.outer as outer

    on_device = _run(False, {})[0]
    monkeypatch.setattr(outer, "state_fits", lambda params, copies: False)
    with caplog.at_level("INFO"):
        crowded, _, rule, _ = _run(None, {})
    assert rule.held_on_host and torch.equal(flat_params(crowded), flat_params(on_device))
    said = [r.getMessage() for r in caplog.records if "host memory" in r.getMessage()]
    assert len(said) == 1 and "state_on_host=False" in said[0]
