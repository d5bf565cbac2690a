"""The parameter store on its own, without a Trainer: the captured update, the snapshot and rollback (module
buffers included), when its buffer exists, the predicted update, offload, and the trainable set."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hybrid.engine import ParameterStore


def _setup(keep: bool = True, memory: str = "none", groups: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))
    params = (
        [{"params": model[0].parameters()}, {"params": [*model[1].parameters(), *model[2].parameters()]}]
        if groups
        else model.parameters()
    )
    optimizer = torch.optim.Adam(params, lr=0.1)
    store = ParameterStore(optimizer, lambda t: t, memory, list(model.buffers()), keep)
    return model, optimizer, store


def _train_step(model, optimizer):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).square().mean().backward()
    optimizer.step()


def _copies(tensors):
    return [t.detach().clone() for t in tensors]


@pytest.mark.parametrize("keep", [True, False])
def test_the_capture_holds_the_update_exactly(keep):
    model, optimizer, store = _setup(keep)
    _train_step(model, optimizer)  # Adam's state exists
    old = _copies(store.params)
    store.before_update()
    _train_step(model, optimizer)
    store.after_update()
    assert all(torch.equal(d, p - o) for d, p, o in zip(store.buffer, store.params, old))
    store.release_buffer()
    assert bool(store.buffer) is keep  # per-step: freed once read


def test_a_rollback_restores_the_weights_and_the_module_buffers_bitwise():
    model, optimizer, store = _setup(keep=False)
    _train_step(model, optimizer)
    weights, buffers = _copies(store.params), _copies(model.buffers())
    store.take_snapshot()
    assert store.snapshot_alive and store.buffer  # held while the segment awaits its verdict
    store.add([[torch.ones_like(p) for p in g] for g in store.groups], [0.5] * len(store.groups))
    model(torch.randn(8, 4))  # a forward in train mode moves BatchNorm's statistics and counter
    assert not all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    store.rollback()
    assert all(torch.equal(a, b) for a, b in zip(weights, store.params))
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    assert not store.snapshot_alive and not store.buffer


def test_a_forward_at_predicted_weights_leaves_no_trace_in_the_buffers():
    model, _, store = _setup()
    buffers = _copies(model.buffers())
    store.take_snapshot()
    model(torch.randn(8, 4))
    store.restore_module_buffers()
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))


def test_the_predicted_update_adds_each_groups_direction_times_its_scale():
    _, _, store = _setup(groups=True)
    before = _copies(store.params)
    directions = [[torch.full_like(p, 2.0) for p in g] for g in store.groups]
    store.add(directions, [0.5, 0.0])  # the second group does not move
    n = len(store.groups[0])
    assert all(torch.equal(p, b + 1.0) for p, b in zip(store.params[:n], before[:n]))
    assert all(torch.equal(p, b) for p, b in zip(store.params[n:], before[n:]))


def test_aggressive_memory_holds_the_snapshot_on_the_host_and_frees_the_device_buffer():
    model, optimizer, store = _setup(keep=True, memory="aggressive")
    _train_step(model, optimizer)
    weights = _copies(store.params)
    store.take_snapshot()
    assert store.snapshot_on_host and not store.buffer
    assert all(p.grad is None for p in model.parameters())  # gradients freed for the segment
    store.add([[torch.ones_like(p) for p in g] for g in store.groups], [1.0])
    held = store.snapshot()
    store.rollback()
    assert all(torch.equal(a, b) for a, b in zip(weights, store.params))
    assert all(torch.equal(a, b) for a, b in zip(weights, held))  # what a checkpoint would hold
    assert store.buffer  # the kept buffer is back


def test_offload_moves_the_optimizer_state_aside_and_back_unchanged():
    model, optimizer, store = _setup(memory="offload")
    _train_step(model, optimizer)
    moments = [_copies(s.values()) for s in optimizer.state.values() if isinstance(s, dict)]
    store.take_snapshot()
    assert store.offload.offloaded
    store.restore_optimizer_state()
    store.wait_for_optimizer_state()
    again = [_copies(s.values()) for s in optimizer.state.values()]
    assert all(torch.equal(a, b) for m, n in zip(moments, again) for a, b in zip(m, n))


def test_a_loaded_snapshot_is_held_and_rolled_back_to():
    _, _, store = _setup(keep=False)
    saved = [torch.randn_like(p) for p in store.params]
    store.load_snapshot(saved)
    assert store.snapshot_alive
    store.rollback()
    assert all(torch.equal(a, b) for a, b in zip(saved, store.params))


def test_the_store_sees_parameters_frozen_and_groups_added():
    model, optimizer, store = _setup()
    assert not store.trainable_changed() and not store.any_frozen()
    model[0].weight.requires_grad_(False)
    assert store.trainable_changed() and store.any_frozen()
    model[0].weight.requires_grad_(True)
    optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})
    assert store.trainable_changed() and not store.any_frozen()


def test_an_optimizer_without_trainable_parameters_is_refused():
    layer = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ParameterStore(torch.optim.SGD(layer.parameters(), lr=0.1), lambda t: t)
