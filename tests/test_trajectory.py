"""The ``outer`` rule: the jump arithmetic against a reference, delayed verification on a river-valley loss, the
guards, and what a Lightning run sees (plain training at eta=1, mu=0, exact resume inside a verification window,
DDP ranks, settings refused by name)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_hybrid import HybridConfig, hybrid_callbacks, is_unverified_checkpoint
from lightning_hybrid.predictors import OuterMomentum
from lightning_hybrid.predictors.outer_jump import JumpPlan
from tests.helpers import (
    RULE_PHASES,
    RegressionModel,
    bare_engine,
    bare_step,
    by_step,
    flat_params,
    hybrid_trainer,
    loader,
    plugin_state,
    report_of,
    scheduler_of,
    snoo,
)

# ------------------------------------------------------------------------------------------------ a bare torch loop


def engine_loop(model, optimizer, rule, steps, batch, config, monitor=None):
    """Hand every step of a plain torch loop to the engine, as the hybrid strategy and scheduler do in Lightning.
    ``batch(step)`` returns the step's loss function of the model. Returns the engine and each step's loss."""
    engine = bare_engine(config, rule, optimizer, monitor)
    losses = [bare_step(engine, optimizer, lambda s=s: batch(s)(model), s).item() for s in range(1, steps + 1)]
    return engine, losses


def regression_batches(seed=1):
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)) for _ in range(64)]
    return lambda step: lambda m: nn.functional.mse_loss(m(data[step][0]), data[step][1])


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def test_outer_jumps_match_a_reference_snoo_loop_over_several_cycles():
    """anchor, b and the weights after each jump: anchor <- anchor - eta (mu b + s), b <- mu b + s, theta <- anchor,
    written out in plain torch, against the engine's in-place displacement form. A cycle's jump is made as the next
    step starts."""
    warm, k, eta, mu, steps = 3, 5, 0.7, 0.5, 24  # four jumps, the last one followed by one step
    model = small_net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    config = HybridConfig(warmup_steps=warm, full_steps=k)
    engine, _ = engine_loop(
        model,
        optimizer,
        snoo(eta, mu, verify_window=0),
        steps,
        regression_batches(),
        config,
    )
    ref = small_net()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    batch, params = regression_batches(), list(ref.parameters())
    for step in range(1, steps + 1):
        if step == warm + 1:
            anchor, b = [p.detach().clone() for p in params], [torch.zeros_like(p) for p in params]
        if step - 1 > warm and (step - 1 - warm) % k == 0:  # the last step ended a cycle
            with torch.no_grad():
                for p, a, m in zip(params, anchor, b):
                    s = a - p
                    m.mul_(mu).add_(s)
                    a.sub_(eta * (mu * m + s))
                    p.copy_(a)
        ref_opt.zero_grad()
        batch(step)(ref).backward()
        ref_opt.step()
    assert engine.record.counters.jumps_made == 4
    for got, want in [
        (list(model.parameters()), params),
        (engine.store.buffer, anchor),
        (engine.parts.predictor._b, b),
    ]:
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    assert not torch.equal(flat_params(model), flat_params(small_net()))


@pytest.mark.parametrize(
    ("rule", "window", "capture", "copies"),
    [
        (snoo(0.7, 0.5), 5, "per_step", 3),  # the anchor (in the update buffer), b, the last jump
        (snoo(0.7, 0.5), 0, "per_step", 2),  # unchecked jumps: no copy of the last one
        (snoo(0.7, 0.5, alignment_window=3), 5, "per_step", 3),  # the alignment reads the same last jump
        (snoo(0.7, 0.5, alignment_window=3), 0, "per_step", 3),  # which it holds without verification
        (snoo(0.7, 0.0), 0, "per_step", 1),  # Lookahead: the anchor alone
        (snoo(0.7, 0.5, state_on_host=True), 5, "per_step", 1),  # b and the last jump wait on the host
    ],
)
def test_parameter_copies_each_rule_holds(rule, window, capture, copies):
    model = small_net()
    config = HybridConfig(warmup_steps=2, full_steps=5, capture_buffer=capture)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine, _ = engine_loop(model, optimizer, judged(rule, window), 12, regression_batches(), config)
    held = [
        *engine.store.buffer,
        *getattr(rule, "_b", []),
        *getattr(rule, "_before_jump", []),
        *getattr(rule, "_x", []),
    ]
    held += [t for h in getattr(rule, "_held", {}).values() for t in h._on_device or []]  # brought to the device
    numel = sum(p.numel() for p in model.parameters())
    assert sum(t.numel() for t in held) == copies * numel


@pytest.mark.parametrize("state_on_host", [False, True])
def test_a_jump_holds_two_parameter_copies_more_while_it_runs(state_on_host):
    """The new momentum and the new weights are the only parameter-sized tensors a jump makes: with the weights,
    the anchor, the momentum and the weights before the last jump, which it replaces, the most it holds at once.
    The alignment verdict makes as many."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Alive(TorchDispatchMode):
        """The most tensors shaped like the first parameter, made while it is on, alive at once."""

        def __init__(self, shape: torch.Size) -> None:
            super().__init__()
            self.shape, self.alive, self.most = shape, set(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.shape == self.shape and id(t) not in self.alive:
                    self.alive.add(id(t))
                    weakref.finalize(t, self.alive.discard, id(t))
                    self.most = max(self.most, len(self.alive))
            return out

    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(9, 7, generator=gen), torch.randn(5, generator=gen)]
    rule = snoo(0.7, 0.5, state_on_host=state_on_host)
    rule.setup(params, keep_jump=True)
    anchor = [p + 0.1 for p in params]
    rule.jump(params, anchor)  # a momentum to carry on with
    torch._foreach_add_(params, [-0.05 * torch.ones_like(p) for p in params])
    alive = Alive(params[0].shape)
    with alive:
        planned = rule.jump(params, anchor)
    assert not planned.restart and alive.most == 2 + 2 * state_on_host  # with b and the jump brought over
    torch._foreach_add_(params, [0.01 * torch.ones_like(p) for p in params])
    aligning = Alive(params[0].shape)
    with aligning:  # the alignment verdict's temporaries: the jump (from the weights kept) and the displacement
        rule.alignment_terms(params, anchor)
    assert aligning.most == 2 + state_on_host  # with the weights kept brought over


# ------------------------------------------------------------------------------------------------ river valley
# A steep quadratic across (v) a slowly descending valley floor (u): L = A/2 (v - xi)^2 + C/2 (u - U)^2, where
# each batch jitters the valley's centre xi. SGD with lr * A = 1 relaxes v in one step.
A, C, U, LR, XI = 10.0, 0.1, 10.0, 0.1, 0.02


class Valley(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))


class Held:
    """Weights held aside, where a batch's loss function expects a model."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w


def valley_batches(seed=0):
    xi = torch.randn(200, generator=torch.Generator().manual_seed(seed)) * XI
    return lambda step: lambda m: 0.5 * A * (m.w[1] - xi[step]) ** 2 + 0.5 * C * (m.w[0] - U) ** 2


class FixedJump(OuterMomentum):
    """A test double of known effect: every jump moves the weights by ``(along, across)`` the valley, times
    ``scale``. Across, it overshoots: the loss rises at once and the overshoot is gone one step later."""

    def __init__(self, along: float = 0.6, across: float = 0.4, scale: float = 1.0) -> None:
        super().__init__()
        self.d = torch.tensor([along, across]) * scale
        self.points: list[tuple[torch.Tensor, torch.Tensor]] = []  # the weights before and after each jump

    def jump(self, params, anchor, measure=True):  # its size is not measured: `hybrid/jump_size` stays nan
        with torch.no_grad():
            before = params[0].detach().clone()
            params[0].add_(self.d)
            if self._before_jump:  # kept for a verdict
                self._before_jump[0].copy_(before)
            anchor[0].copy_(params[0])
        self.points.append((before, params[0].detach().clone()))
        return JumpPlan([], [], restart=False, size=None)


def judged(rule, window, resolution=0.0):
    """``rule`` with this test's delayed verdict: windows of ``window`` steps, no limit on their spread unless
    ``resolution`` is given."""
    rule.verify_window, rule.verify_resolution = window, resolution
    return rule


def valley_run(rule, steps=66, verify_window=5):
    model = Valley()
    config = HybridConfig(warmup_steps=5, full_steps=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine, losses = engine_loop(model, optimizer, judged(rule, verify_window), steps, valley_batches(), config)
    return engine, losses, model.w.detach()


def test_delayed_verification_keeps_a_jump_that_an_immediate_check_would_reject():
    rule = FixedJump()
    engine, losses, w = valley_run(rule)
    counters = engine.record.counters
    assert counters.jumps_made == 6 and counters.jumps_kept == 5 and counters.rollbacks == 0
    # on the batch right after each jump the jumped weights lose to the weights before it: a check at that moment
    # (the jump against no jump) rejects every one
    batches = valley_batches()
    for n, (before, after) in enumerate(rule.points):
        loss_at = batches(5 + 10 * (n + 1) + 1)
        assert loss_at(Held(after)) > loss_at(Held(before)), n
    _, plain_losses, plain_w = valley_run(snoo(outer_lr=1.0, outer_momentum=0.0))
    assert w[0] > plain_w[0] + 1.0  # further down the valley
    assert sum(losses[-5:]) < sum(plain_losses[-5:]) * 0.9


def test_the_same_jump_fifty_times_over_is_rolled_back_at_once():
    engine, losses, w = valley_run(FixedJump(scale=50.0))
    counters = engine.record.counters
    assert counters.rollbacks >= 1 and engine.parts.monitor.events["zscore"] >= 1
    assert counters.jumps_kept == 0
    assert torch.isfinite(w).all() and losses[-1] < 5.0


def test_a_jump_that_loses_ground_is_rolled_back_after_its_window():
    engine, _, _ = valley_run(FixedJump(along=-2.0, across=0.0))  # back up the valley: no blow-up, just worse later
    assert engine.parts.monitor.events["delayed"] >= 1 and engine.parts.monitor.events["zscore"] == 0
    assert engine.record.counters.jumps_kept == 0
    assert engine.policy.prediction_off is False or engine.record.counters.rollbacks >= 5


def test_alignment_is_the_cosine_between_the_last_jump_and_the_displacement_since():
    rule = snoo(alignment_window=2)
    anchor = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    rule.setup(anchor, keep_jump=True)
    jump = [torch.tensor([1.0, 0.0]), torch.tensor([[1.0]])]
    torch._foreach_copy_(rule._before_jump, torch._foreach_sub(anchor, jump))  # the anchor is where it landed
    moved = [torch.tensor([2.0, 1.0]), torch.tensor([[2.0]])]  # 2 x the jump, plus (0, 1, 0) across it
    params = torch._foreach_add(anchor, moved)
    terms = rule.alignment_terms(params, anchor).tolist()  # [d . jump, |d|^2, |jump|^2]
    assert terms == pytest.approx([4.0, 9.0, 2.0], abs=1e-12)  # cosine 4 / sqrt(18)


@pytest.mark.parametrize("cosine", [0.3, -0.3, 1e-3, -1e-3])
def test_the_restart_decides_on_the_cosine_and_a_jump_takes_a_fixed_number_of_operations(cosine):
    """The restart's decision, from squared norms (``2 μ s · b = |s + μ b|² - |s|² - μ²|b|²``, in float64), agrees
    with the sign of a float64 dot product down to cosines of 0.001; the operations of a jump, at most 10, and the
    bytes it moves, at most 23 parameter copies, do not grow with the number of tensors (fused: a GPU launches a
    handful of kernels a jump)."""
    from benchmarks.jump_cost import Count

    def jump(count: int) -> tuple[bool, int, list[torch.Tensor]]:
        gen = torch.Generator().manual_seed(count)
        params = [torch.randn(7, 5, generator=gen) * 10 ** (i % 3) for i in range(count)]  # norms 1 to 100
        s = [0.01 * torch.randn(p.shape, generator=gen) for p in params]
        flat = torch.cat([t.flatten() for t in s]).double()
        other = torch.randn(flat.shape, generator=gen, dtype=torch.float64)
        other -= (other @ flat) / (flat @ flat) * flat  # across s
        b = cosine * flat / flat.norm() + (1 - cosine**2) ** 0.5 * other / other.norm()  # at `cosine` to s
        rule = snoo(0.7, 0.5, restart=True)
        rule.setup(params, keep_jump=True)
        parts = b.float().split([p.numel() for p in params])
        torch._foreach_copy_(rule._b, [t.view_as(p) for t, p in zip(parts, params)])
        anchor, before = list(torch._foreach_add(params, s)), [p.clone() for p in params]
        ops = Count()
        with ops:
            restarted = rule.jump(params, anchor).restart
        if restarted:  # the momentum reset, and nothing moved
            assert all(t.abs().sum() == 0 for t in rule._b)
            assert all(torch.equal(p, q) for p, q in zip(params, before))
        copies = ops.bytes / sum(p.numel() * p.element_size() for p in params)
        return restarted, ops.ops, round(copies, 6)

    few, many = jump(3), jump(40)
    assert few[0] == many[0] == (cosine < 0)
    assert few[1:] == many[1:] and few[1] <= 10 and few[2] <= 23


def test_jumps_that_keep_norms_change_each_tensors_direction_only_and_undo_exactly():
    torch.manual_seed(0)
    params = [torch.randn(4, 3), torch.randn(5)]
    rule = snoo(0.7, 0.5, keep_norms=True)
    rule.setup(params, keep_jump=True)
    anchor = [p + 0.3 * torch.randn_like(p) for p in params]  # the cycle moved from here to ``params``
    before = [p.clone() for p in params]
    rule.jump(params, anchor)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.norm(), b.norm())
        assert not torch.allclose(p, b)
    assert all(torch.equal(a, p) for a, p in zip(anchor, params))  # the new anchor
    rule.undo(params, anchor)
    for p, b in zip(params, before):
        torch.testing.assert_close(p, b)


def test_keep_norms_on_shards_sums_each_tensors_squared_norm_over_ranks():
    """The sharded path (one collective a jump: every squared norm the restart, the size and the norms kept need)
    lands where the whole tensors' path does, here on one rank whose shards are the tensors."""
    torch.manual_seed(0)
    whole = [torch.randn(4, 3), torch.randn(5)]
    anchor = [p + 0.3 * torch.randn_like(p) for p in whole]
    sharded, calls = [p.clone() for p in whole], []
    rule, on_shards = snoo(0.7, 0.5, keep_norms=True), snoo(0.7, 0.5, keep_norms=True)
    rule.setup(whole, keep_jump=True)
    on_shards.setup(sharded, keep_jump=True)
    on_shards.sum_across_ranks = lambda t: calls.append(t.shape) or t
    size = rule.jump(whole, [a.clone() for a in anchor]).size
    sharded_size = on_shards.jump(sharded, [a.clone() for a in anchor]).size
    assert calls == [torch.Size([5 * 2])]  # one collective: each tensor's |s|², |b|², |b'|², |w|², |w'|²
    torch.testing.assert_close(sharded, whole)
    torch.testing.assert_close(sharded_size, size)


def aligned_jump(along, across, window=2):
    rule = FixedJump(along=along, across=across)
    rule.alignment_window = window
    return rule


def test_jumps_that_training_carries_on_go_on_though_each_raises_the_loss_at_once():
    """Along the valley, training keeps going the jump's way, though across it the jump overshoots (the loss rises
    at once, as in the test above): every alignment is positive and the jumps go on to the end."""
    engine, losses, _ = valley_run(aligned_jump(0.6, 0.2))
    family = engine.family
    assert engine.record.counters.jumps_made == 6
    assert len(family.state.alignments) == 2 and all(a > 0 for a in family.state.alignments)
    assert family.state.stopped_at == -1 and family.summary()["jumps_stopped_at"] is None
    _, plain_losses, _ = valley_run(snoo(outer_lr=1.0, outer_momentum=0.0))
    assert sum(losses[-5:]) < sum(plain_losses[-5:])


def test_jumps_that_training_walks_back_stop_where_the_verdict_against_before_keeps_them():
    """Back up the valley by less than a cycle's progress: the loss after each jump is still lower than before it,
    so the verdict against the loss before the jump keeps them (5 of 6), while training walks each one back. The
    alignment verdict stops them after two, and the run goes on plain, further down the valley."""
    engine, losses, w = valley_run(aligned_jump(-1.0, 0.0))
    family, counters = engine.family, engine.record.counters
    assert counters.jumps_made == counters.jumps_kept == 2 and counters.rollbacks == 0
    assert all(a < -0.99 for a in family.state.alignments)
    assert family.state.stopped_at == 5 + 3 * 10  # the end of the cycle after the second jump
    assert family.summary()["jumps_stopped_at"] == 35
    unjudged, unjudged_losses, unjudged_w = valley_run(FixedJump(along=-1.0, across=0.0))
    assert unjudged.record.counters.jumps_kept == 5 and unjudged.record.counters.rollbacks == 0
    assert w[0] > unjudged_w[0] + 3.0 and sum(losses[-5:]) < sum(unjudged_losses[-5:])


def target_run(restart, target, steps=66):
    """SGD halfway to ``target(step)`` each step, under ``outer`` (cycles of 10 after 5 warmup steps)."""
    model = Valley()
    config = HybridConfig(warmup_steps=5, full_steps=10)
    rule = snoo(restart=restart, verify_window=0)
    batches = lambda step: lambda m: 0.5 * ((m.w - target(step)) ** 2).sum()  # noqa: E731
    engine, _ = engine_loop(model, torch.optim.SGD(model.parameters(), lr=0.5), rule, steps, batches, config)
    return engine.record.counters, model.w.detach(), report_of(engine)


def test_restart_makes_no_jump_where_cycles_turn_back_and_every_jump_where_they_go_on():
    """Targets that swap sides every cycle: each cycle's displacement points against the momentum the last one
    left, so every other cycle restarts it and makes no jump (the one after has no momentum to disagree with).
    A target moving steadily one way: every cycle goes on along the momentum and every jump is made, as without
    restarts, to the same weights."""
    swapping = lambda step: 1.0 if ((step - 6) // 10) % 2 == 0 else -1.0  # noqa: E731
    counters, _, said = target_run(True, swapping)
    assert (counters.jumps_made, counters.jump_restarts) == (3, 3)  # cycles ending at 15, 25, ..., 65: J R J R J R
    assert "3 jumps made, none judged (verify_window=0); 3 cycles restarted the momentum instead" in said
    assert target_run(False, swapping)[0].jumps_made == 6
    steady = lambda step: 0.1 * step  # noqa: E731
    (counters, w, _), (unrestarted, w_plain, _) = target_run(True, steady), target_run(False, steady)
    assert (counters.jumps_made, counters.jump_restarts) == (unrestarted.jumps_made, 0) == (6, 0)
    assert torch.equal(w, w_plain)


def test_lookahead_under_the_default_guards_jumps_every_cycle_with_nothing_to_restart():
    """``outer_momentum=0`` (Lookahead) with ``restart`` on, as the defaults have it: no momentum to reset, so no
    cycle is left without its jump (it was refused before ``restart`` became a default)."""
    rule = OuterMomentum(outer_momentum=0.0)
    assert rule.restart and rule.keep_norms
    counters, _, _ = noisy_target_run(0.0, noisy_from=10**6, rule=rule)
    assert counters.jumps_made >= 4 and counters.jump_restarts == 0


def test_the_verdicts_margin_against_the_loss_decides_whether_it_can_judge():
    rule = OuterMomentum(verify_window=8, verify_sigmas=2.0, verify_resolution=0.2)  # margin = 2 * spread / 2
    assert rule.blind(mean=1.0, spread=0.3) and rule.blind(mean=-1.0, spread=0.3)
    assert not rule.blind(mean=1.0, spread=0.1)
    assert OuterMomentum(verify_window=8).blind(mean=1.0, spread=0.3)  # the default limit: 0.2
    assert not OuterMomentum(verify_window=8, verify_resolution=0).blind(mean=1.0, spread=100.0)  # 0: no limit
    assert not OuterMomentum(verify_window=0, verify_resolution=0.2).blind(mean=1.0, spread=100.0)


def noisy_target_run(resolution, noisy_from, rule=None, steps=66):
    """``target_run``'s steady target under ``rule`` (default ``outer``), with verification windows of 4 steps,
    and a constant added to each step's loss from step ``noisy_from`` on: +1 and -1 in turn, so that every later
    window's mean is its losses' level and their spread is 1, and no gradient changes."""
    model = Valley()
    config = HybridConfig(warmup_steps=5, full_steps=10)
    noise = lambda step: 0.0 if step < noisy_from else (-1.0) ** step  # noqa: E731
    batches = lambda step: lambda m: 0.5 * ((m.w - 0.1 * step) ** 2).sum() + noise(step)  # noqa: E731
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, _ = engine_loop(model, optimizer, judged(rule or snoo(), 4, resolution), steps, batches, config)
    return engine.record.counters, model.w.detach(), report_of(engine)


def test_no_jump_is_made_where_the_cycles_losses_are_too_noisy_for_its_verdict_to_judge():
    """Windows end at steps 15, 25, ..., 65. Quiet until step 38 (the first step after the third jump is judged
    quietly), a margin of 2 * 1 * sqrt(2 / 4) = 1.41 from then on, far above a fifth of the loss: the three cycle
    ends after it make no jump, and say why; the quiet ones jump as without the limit. A limit no window reaches
    changes nothing, bit for bit; where no window can be judged, the run is plain training, bit for bit."""
    counters, _, said = noisy_target_run(0.2, noisy_from=38)
    assert (counters.jumps_made, counters.jumps_blind, counters.rollbacks) == (3, 3, 0)
    assert "3 jumps made, 3 kept, 0 undone; 3 cycles too noisy to judge a jump" in said
    unlimited, w, _ = noisy_target_run(0.0, noisy_from=38)
    assert (unlimited.jumps_made, unlimited.jumps_blind) == (6, 0)
    loose, w_loose, _ = noisy_target_run(1e6, noisy_from=38)
    assert (loose.jumps_made, loose.jumps_blind) == (6, 0) and torch.equal(w_loose, w)
    counters, w_blind, _ = noisy_target_run(0.2, noisy_from=0)  # never able to judge: plain training, bit for bit
    assert (counters.jumps_made, counters.jumps_blind) == (0, 6)
    _, w_plain, _ = noisy_target_run(0.0, noisy_from=0, rule=snoo(outer_lr=1.0, outer_momentum=0.0))
    assert torch.equal(w_blind, w_plain)


# ------------------------------------------------------------------------------------------------ Lightning runs


def fit_regression(callbacks, steps=40, strategy=True, **kwargs):
    if strategy:
        trainer, _ = hybrid_trainer(steps, hybrid=callbacks, logger=False, **kwargs)
    else:
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            **kwargs,
        )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=16))
    return model, trainer


def test_outer_with_eta_one_and_no_momentum_is_plain_lightning_bitwise():
    plain, _ = fit_regression([], strategy=False)
    hybrid, _ = fit_regression(hybrid_callbacks(predictor=snoo(1.0, 0.0), **RULE_PHASES))
    assert torch.equal(flat_params(hybrid), flat_params(plain))
    assert hybrid.backward_calls == plain.backward_calls == 40


def test_a_lightning_run_whose_verdict_cannot_judge_any_cycle_trains_plainly_and_says_so():
    """The monitor's ``verify_resolution`` reaches the jumps through ``hybrid_callbacks``: a limit below every
    window's margin (16-sample batches of noise) makes no jump, and the weights are plain Lightning's."""
    plain, _ = fit_regression([], strategy=False)
    callbacks = hybrid_callbacks(predictor="outer", **RULE_PHASES, verify_window=3, verify_resolution=1e-6)
    model, trainer = fit_regression(callbacks)
    counters = scheduler_of(trainer).counters
    assert (counters.jumps_made, counters.jumps_blind) == (0, (40 - 5) // 6 - 1)
    assert torch.equal(flat_params(model), flat_params(plain)) and model.backward_calls == 40


def test_outer_jumps_every_cycle_in_a_lightning_run_and_keeps_every_backward_pass():
    model, trainer = fit_regression(hybrid_callbacks(predictor=snoo(), **RULE_PHASES))
    counters = scheduler_of(trainer).counters
    assert counters.jumps_made == (40 - 5) // 6 - 1  # the last cycle's jump could not be verified in time
    assert f"{counters.jumps_made} jumps made" in scheduler_of(trainer).report()
    assert model.backward_calls == 40 and counters.backward_skipped == 0
    assert counters.jumps_kept + counters.rollbacks == counters.jumps_made
    plain, _ = fit_regression([], strategy=False)
    assert not torch.equal(flat_params(model), flat_params(plain))


def test_a_lightning_run_whose_jumps_training_walks_back_stops_them_and_says_so():
    model, trainer = fit_regression(hybrid_callbacks(predictor=snoo(alignment_window=2), **RULE_PHASES))
    summary = scheduler_of(trainer).summary()
    unjudged, unjudged_trainer = fit_regression(hybrid_callbacks(predictor=snoo(), **RULE_PHASES))
    assert summary["jump_alignment"] <= 0 and summary["jumps_stopped_at"] == 5 + 4 * 6  # after the third jump
    assert summary["jumps_made"] == 3 < scheduler_of(unjudged_trainer).summary()["jumps_made"]
    assert f"jumps stopped at step {summary['jumps_stopped_at']}" in scheduler_of(trainer).report()
    assert model.backward_calls == unjudged.backward_calls == 40


@pytest.mark.parametrize("max_steps", [35, 40, 41])
def test_no_jump_is_made_that_fit_cannot_verify(max_steps):
    """Cycles end at steps 11, 17, 23, ...; the jump a cycle's end decides on is made as the next step starts, and
    its verdict comes one cycle later. A jump whose verdict would fall after ``max_steps`` is not made, so the last
    validation and the weights ``fit`` hands back are the same; without verification every cycle's end but the
    run's last one jumps."""

    class LastValidation(L.Callback):
        def on_validation_start(self, trainer, pl_module):
            self.seen = flat_params(pl_module)

    ends = range(5 + 6, max_steps + 1, 6)  # the cycles' ends
    watch = LastValidation()
    trainer, _ = hybrid_trainer(
        max_steps,
        hybrid=hybrid_callbacks(predictor=snoo(), **RULE_PHASES),
        logger=False,
        extra_callbacks=[watch],
        val_check_interval=max_steps,
        check_val_every_n_epoch=None,
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=16), loader(16, batch_size=16))
    summary = scheduler_of(trainer).summary()
    assert summary["jumps_made"] == sum(end + 6 <= max_steps for end in ends)
    assert summary["undone_by"]["end_of_fit"] == 0
    assert torch.equal(watch.seen, flat_params(model))
    _, unverified = fit_regression(hybrid_callbacks(predictor=snoo(verify_window=0), **RULE_PHASES), steps=max_steps)
    assert scheduler_of(unverified).counters.jumps_made == sum(end < max_steps for end in ends)


def test_no_jump_lands_on_a_parameter_frozen_between_the_cycles_end_and_the_jump():
    class FreezeAtCycleEnd(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
            if trainer.global_step == 17:  # a cycle's end: its jump is due as step 18 starts
                self.param = next(pl_module.parameters())
                self.param.requires_grad_(False)
                self.frozen = self.param.detach().clone()

    watch = FreezeAtCycleEnd()
    _, trainer = fit_regression(hybrid_callbacks(predictor=snoo(), **RULE_PHASES), extra_callbacks=[watch])
    assert torch.equal(watch.param, watch.frozen)
    assert scheduler_of(trainer).counters.jumps_made >= 2  # jumps went on after the set was tracked again


def test_outer_runs_under_manual_optimization():
    trainer, _ = hybrid_trainer(40, hybrid=hybrid_callbacks(predictor=snoo(), **RULE_PHASES), logger=False)
    model = RegressionModel(automatic=False, scheduler=False)
    start = flat_params(model)
    trainer.fit(model, loader(64, batch_size=16))
    engine = scheduler_of(trainer).engine
    assert model.backward_calls == 40 and torch.isfinite(flat_params(model)).all()
    assert not torch.equal(flat_params(model), start)
    assert engine.record.counters.jumps_made == (40 - 5) // 6 - 1  # the last one: no time to verify


def _checkpointed_run(root, predictor, ckpt_path=None, batch_size=16, **settings):
    """40 steps of 64 samples an epoch, checkpointed at every epoch's end (4 steps at the default batch size), where
    Lightning resumes exactly."""
    every = ModelCheckpoint(
        dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=64 // batch_size, filename="{step}"
    )
    trainer, _ = hybrid_trainer(
        40,
        hybrid=hybrid_callbacks(predictor=predictor, **{**RULE_PHASES, **settings}),
        extra_callbacks=[every] if ckpt_path is None else [],
        logger=False,
        enable_checkpointing=ckpt_path is None,
        default_root_dir=root,
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=batch_size), ckpt_path=ckpt_path)
    return model, trainer


def _engine_state(path):
    checkpoint = torch.load(path, weights_only=False)
    return checkpoint, plugin_state(checkpoint)


@pytest.mark.parametrize(
    ("saved", "resumed_as"),
    [
        (lambda: snoo(), lambda: snoo()),
        # b is on the device when saved (brought there by the restart's test); resumed without state_on_host
        (lambda: snoo(restart=True, state_on_host=True), lambda: snoo(restart=True)),
    ],
    ids=["outer", "state-on-host"],
)
def test_resume_between_a_cycles_end_and_its_jump_is_bitwise_exact(tmp_path, saved, resumed_as):
    """A checkpoint at a cycle's end holds the jump still to make (as the next step starts) and the anchor before
    it; resumed, the run makes the same jump. One step an epoch, so that every step's checkpoint resumes exactly."""
    model, trainer = _checkpointed_run(tmp_path / "full", saved(), batch_size=64)
    path = tmp_path / "full" / "ckpt" / "step=17.ckpt"  # the end of the second cycle after warmup (5 + 6 + 6)
    assert _engine_state(path)[1]["family"]["jump_due"]
    resumed, resumed_trainer = _checkpointed_run(tmp_path / "resume", resumed_as(), ckpt_path=path, batch_size=64)
    assert torch.equal(flat_params(resumed), flat_params(model))
    assert scheduler_of(resumed_trainer).summary()["jumps_made"] == scheduler_of(trainer).summary()["jumps_made"]


def _rule_state(path):
    return torch.load(path, weights_only=False)["callbacks"]["DynamicsPredictor"]["predictor"]


RELEASED = {
    "outer": lambda: snoo(keep_norms=True, restart=True),
    "state-on-host": lambda: snoo(keep_norms=True, restart=True, state_on_host=True),
}


@pytest.mark.parametrize("kind", list(RELEASED))
def test_after_fit_a_rule_lets_its_copies_go_keeps_its_state_for_checkpoints_and_resumes_when_reused(tmp_path, kind):
    """As Lightning moves the optimizer's state off the device at teardown, a rule lets its device copies go at the
    end of ``fit``; a checkpoint taken after ``fit`` still holds its state, and the same rule object resumes a
    checkpoint in a second ``fit`` exactly as a fresh one does (it once restored it, then set it up afresh)."""
    rule = RELEASED[kind]()
    model, trainer = _checkpointed_run(tmp_path / "full", rule)
    held = [rule._b, rule._before_jump, list(rule._held.values())]
    assert not any(held)
    last = _rule_state(tmp_path / "full" / "ckpt" / "step=40.ckpt")
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    after = _rule_state(tmp_path / "after.ckpt")
    assert last.keys() == after.keys() and any(last.values())
    for key in last:
        assert len(last[key]) == len(after[key]) and all(map(torch.equal, last[key], after[key])), key
    path = tmp_path / "full" / "ckpt" / "step=20.ckpt"
    fresh, _ = _checkpointed_run(tmp_path / "fresh", RELEASED[kind](), ckpt_path=path)
    reused, _ = _checkpointed_run(tmp_path / "reused", rule, ckpt_path=path)
    assert torch.equal(flat_params(reused), flat_params(fresh))
    assert torch.equal(flat_params(fresh), flat_params(model))


def test_resume_across_cycles_too_noisy_to_judge_is_bitwise_exact(tmp_path):
    """A limit that some of this run's windows pass and some do not (one jump made, two cycles too noisy, one
    restart): resumed from each checkpoint, the same decisions and the same weights."""
    rule = lambda: snoo(keep_norms=True, restart=True, verify_resolution=0.4)  # noqa: E731
    model, trainer = _checkpointed_run(tmp_path / "full", rule())
    want = scheduler_of(trainer).summary()
    assert (want["jumps_made"], want["blind_cycles"], want["momentum_restarts"]) == (1, 2, 1)
    for path in sorted((tmp_path / "full" / "ckpt").glob("*.ckpt"))[:-1]:
        resumed, again = _checkpointed_run(tmp_path / path.stem, rule(), ckpt_path=path)
        assert torch.equal(flat_params(resumed), flat_params(model)), path.name
        got = scheduler_of(again).summary()
        assert [got[k] for k in ("jumps_made", "blind_cycles", "momentum_restarts")] == [1, 2, 1], path.name


ALIGNED = {
    "outer": lambda: snoo(),
    "outer_aligned": lambda: snoo(alignment_window=2),
    "outer_norm": lambda: snoo(keep_norms=True),
    "outer_norm_aligned": lambda: snoo(alignment_window=2, keep_norms=True),
    "outer_norm_restart": lambda: snoo(keep_norms=True, restart=True),
    "outer_norm_restart_on_host": lambda: snoo(keep_norms=True, restart=True, state_on_host=True),
}


@pytest.mark.parametrize("kind", list(ALIGNED))
def test_resume_inside_an_outer_verification_window_is_bitwise_exact(tmp_path, kind):
    model, trainer = _checkpointed_run(tmp_path / "full", ALIGNED[kind]())
    reference = flat_params(model)
    inside = []
    for path in by_step(tmp_path / "full" / "ckpt"):
        checkpoint, state = _engine_state(path)
        if state["family"]["pending"] and checkpoint["global_step"] < 40:  # the last one has no step to resume
            assert is_unverified_checkpoint(checkpoint)
            inside.append(path)
    assert len(inside) >= 2, "no checkpoint fell inside a verification window"
    for path in inside:
        resumed, resumed_trainer = _checkpointed_run(tmp_path / f"resume_{path.stem}", ALIGNED[kind](), ckpt_path=path)
        assert torch.equal(flat_params(resumed), reference), path.name
        summary, want = scheduler_of(resumed_trainer).summary(), scheduler_of(trainer).summary()
        keys = ("jumps_made", "jumps_kept", "momentum_restarts", "jumps_undone", "undone_by")
        for key in (*keys, "jump_alignment", "jumps_stopped_at") if kind == "outer_aligned" else keys:
            assert summary[key] == want[key], key
    if kind == "outer_aligned":  # the windows resumed held alignments
        assert any(_engine_state(path)[1]["family"]["alignments"] for path in inside)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(predictor="outer", bandit=True), "HorizonBandit"),
        (dict(predictor="outer", predict_memory="offload"), "predict_memory"),
        (dict(predictor="outer", full_steps=6, verify_window=7), "verify_window"),
    ],
)
def test_what_a_rule_cannot_do_is_refused_before_training(settings, message):
    trainer, _ = hybrid_trainer(10, hybrid=hybrid_callbacks(**{"warmup_steps": 2, **settings}), logger=False)
    with pytest.raises(MisconfigurationException, match=message):
        trainer.fit(RegressionModel(), loader(64, batch_size=16))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(outer_lr=0.0), "outer_lr"),
        (dict(outer_lr=2.5), "outer_lr"),
        (dict(outer_momentum=1.0), "outer_momentum"),
        (dict(alignment_window=-1), "alignment_window"),
        (dict(alignment_window=2.5), "alignment_window"),
        (dict(keep_norms="yes"), "keep_norms"),
        (dict(restart=1), "restart"),
        (dict(state_on_host="yes"), "state_on_host"),
    ],
)
def test_bad_outer_settings_are_refused_when_built(kwargs, name):
    with pytest.raises(ValueError, match=name):
        OuterMomentum(**kwargs)


def test_rules_leave_the_bandit_out_by_default_and_per_step_predictors_keep_it():
    assert not any(type(cb).__name__ == "HorizonBandit" for cb in hybrid_callbacks(predictor="outer"))
    assert any(type(cb).__name__ == "HorizonBandit" for cb in hybrid_callbacks(predictor="linear"))


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
@pytest.mark.parametrize(
    "kind",
    ["outer", "outer_aligned", "outer_norm", "outer_restart-fused_adam"],
)  # with fused Adam, `outer`'s steps are quiet: guarded on the device, their readings reduced over ranks there
def test_ddp_ranks_stay_identical_under_a_rule(distributed_runs, kind):
    rank0, rank1 = distributed_runs[1][kind]
    assert not torch.equal(rank0["first_batch"], rank1["first_batch"]), "ranks should see different data"
    assert torch.equal(rank0["params"], rank1["params"])
    assert rank0["summary"]["jumps_made"] == rank1["summary"]["jumps_made"]
    assert rank0["summary"]["momentum_restarts"] == rank1["summary"]["momentum_restarts"]
    assert rank0["summary"]["undone_by"] == rank1["summary"]["undone_by"]
    assert rank0["monitor"] == rank1["monitor"]
    for a, b in zip(rank0["rule"].values(), rank1["rule"].values()):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    if kind.startswith("outer"):
        assert rank0["summary"]["jumps_made"] >= 3
    if kind == "outer":
        assert rank0["summary"]["jumps_made"] == (60 - 5) // 6 - 1  # not the last: it could not be verified
    if kind == "outer_aligned":
        assert rank0["summary"]["jump_alignment"] == rank1["summary"]["jump_alignment"] is not None


@pytest.mark.slow
@pytest.mark.xdist_group("ranks")
def test_outer_under_fsdp_jumps_each_ranks_shards_as_ddp_jumps_the_whole(distributed_runs):
    """With the alignment verdict, whose cosine sums each rank's shards."""
    ddp, fsdp = distributed_runs[1]["outer_aligned"], distributed_runs[1]["outer_aligned-fsdp"]
    for key in ("jumps_made", "jumps_kept", "jumps_undone", "undone_by", "jumps_stopped_at"):
        assert fsdp[0]["summary"][key] == fsdp[1]["summary"][key] == ddp[0]["summary"][key], key
    alignments = [run[0]["summary"]["jump_alignment"] for run in (ddp, fsdp)]
    assert alignments[0] is not None and math.isclose(*alignments, rel_tol=1e-4)
    assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])  # gathered from the shards
    torch.testing.assert_close(fsdp[0]["params"], ddp[0]["params"], rtol=1e-5, atol=1e-5)
    numel = ddp[0]["params"].numel()
    local = [sum(t.numel() for t in rank["rule"]["b"]) for rank in fsdp]  # each rank's momentum: its shards
    assert local[0] < numel and sum(local) == numel
