"""An error raised inside a jump of the default rule, at each operation that can fail (an allocation, the
collective over shards, the jump's one read of the host): the weights, the anchor, the outer momentum and the weights
kept for an undo are bitwise what they were, the rule holds nothing on the device, and the next jump lands where an
unbroken one would. Every operation after the first write to any of them is in place (it allocates nothing), so no
later failure can leave the jump half made. Through ``Trainer.fit``: ``test_faults.py``."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from lightning_hybrid.predictors import OuterMomentum
from tests.faults.common import FailAt, Injected, record

CASES = {  # the rule's ways of holding and computing a jump
    "default": {},
    "state on the host": {"state_on_host": True},
    "on shards": {},
    "no momentum (Lookahead)": {"outer_momentum": 0.0},
    "unguarded": {"keep_norms": False, "restart": False},
}


@contextmanager
def failing(rule: OuterMomentum, mode: FailAt):
    """``mode`` over the rule's jump, with the restart's read and the collective as operations that can fail too."""
    original = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        mode.step("tolist")
        return original(self)

    torch.Tensor.tolist = tolist
    if rule.sum_across_ranks is not None:
        rule.sum_across_ranks = lambda t: mode.step("sum_across_ranks") or t.clone()
    try:
        with mode:
            yield
    finally:
        torch.Tensor.tolist = original


def cycle(case: str) -> tuple[OuterMomentum, list[torch.Tensor], list[torch.Tensor]]:
    """A rule one jump into a run, and the weights and anchor of the next cycle's end: tensors whose norms differ
    by 10^4, the cycle moving on the way the last one went (no restart)."""
    gen = torch.Generator().manual_seed(0)
    shapes = (((6, 4), 1e2), ((5,), 1e-2), ((3, 3), 1.0))
    params = [torch.randn(shape, generator=gen) * scale for shape, scale in shapes]
    rule = OuterMomentum(verify_window=3, **CASES[case])
    rule.setup(params, keep_jump=True)
    if case == "on shards":
        rule.sum_across_ranks = lambda t: t.clone()
    anchor = [p.clone() for p in params]
    for _ in range(2):
        torch._foreach_add_(params, [0.01 * p.abs().mean() * (1 + torch.rand(p.shape, generator=gen)) for p in params])
        rule.jump(params, anchor)
    torch._foreach_add_(params, [0.01 * p.abs().mean() * (1 + torch.rand(p.shape, generator=gen)) for p in params])
    return rule, params, anchor


def whole(rule: OuterMomentum, params: list[torch.Tensor], anchor: list[torch.Tensor]) -> list[torch.Tensor]:
    state = rule.state_dict()
    return [*params, *anchor, *state["b"], *state["before_jump"]]


def run_tensors(rule: OuterMomentum, params: list[torch.Tensor], anchor: list[torch.Tensor]) -> list[torch.Tensor]:
    held = [t for h in rule._held.values() for t in h.host]
    return [*params, *anchor, *rule._b, *rule._before_jump, *held]


@pytest.mark.parametrize("case", list(CASES))
def test_an_error_at_any_failing_operation_of_a_jump_leaves_everything_as_it_was(record_property, case):
    rule, params, anchor = cycle(case)
    before = [t.clone() for t in whole(rule, params, anchor)]
    dry = copy.deepcopy((rule, params, anchor))
    counted = FailAt(-1, run_tensors(*dry))
    with failing(dry[0], counted):
        dry[0].jump(dry[1], dry[2])
    unbroken = whole(*dry)
    first_write = next(i for i, (_, writes) in enumerate(counted.seen) if writes)
    later = counted.seen[first_write:]
    assert all(name.split(".")[0].endswith("_") for name, _ in later), later  # in place: nothing can fail there
    assert first_write >= 4 and counted.seen[first_write][0].startswith("_foreach_copy_")  # the weights kept
    for at in range(first_write):
        trial = copy.deepcopy((rule, params, anchor))
        with pytest.raises(Injected), failing(trial[0], FailAt(at, run_tensors(*trial))):
            trial[0].jump(trial[1], trial[2])
        assert all(torch.equal(x, y) for x, y in zip(whole(*trial), before, strict=True)), counted.seen[at]
        assert not any(held.held for held in trial[0]._held.values())
        if trial[0].sum_across_ranks is not None:
            trial[0].sum_across_ranks = lambda t: t.clone()
        trial[0].jump(trial[1], trial[2])  # tried again, the jump lands where the unbroken one did
        assert all(torch.equal(x, y) for x, y in zip(whole(*trial), unbroken, strict=True)), counted.seen[at]
    said = {"tolist": "the jump's one read of the host", "sum_across_ranks": "the collective"}
    reads = [said[name] for name, _ in counted.seen[:first_write] if name in said]
    among = f" ({' and '.join(reads)} among them)" if reads else ""
    after = "the one after it is" if len(later) == 1 else f"the {len(later)} after it are"
    outcome = (
        f"an error at each of the {first_write} operations before the first write{among} left the weights, anchor, "
        f"momentum and the weights kept for an undo bitwise; {after} in place"
    )
    record(record_property, "error raised inside a jump", case, outcome, "default")
