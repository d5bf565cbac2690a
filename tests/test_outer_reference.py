"""Each jump of the default rule against the documented formula computed in float64 from the same float32 inputs:
``s = anchor - w``, ``b' = μ b + s``, ``d = (1 - η) s - η μ b'``, ``w' = w + d``, each tensor scaled back to its
norm (``keep_norms``), the anchor and the weights at ``w'``, ``w`` kept for an undo. Agreement within float32
rounding (a few units in the last place of the operands), on tensors whose norms differ by up to 10^8; an undo
right after it gives ``w`` back bitwise. Each jump made eagerly, and by the fused kernels where Triton is installed
(``kernel_path``)."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.predictors import OuterMomentum
from lightning_hybrid.predictors.outer_fused import FusedJumpPlan

EPS = torch.finfo(torch.float32).eps


def reference(w, a, b, eta, mu, keep_norms):
    """The jump in float64: the new weights and the momentum."""
    w, a, b = w.double(), a.double(), b.double()
    s = a - w
    b_new = mu * b + s
    new = w + (1 - eta) * s - eta * mu * b_new
    if keep_norms:
        new = new * (w.norm() / new.norm())
    return new, b_new


@pytest.mark.parametrize("keep_norms", [True, False])
@pytest.mark.parametrize(("eta", "mu"), [(0.7, 0.5), (1.6, 0.9), (0.5, 0.0)])
@pytest.mark.parametrize("sizes", [[(3,)], [(64, 32), (1,), (7, 3, 5)], [(300, 200), *[(17,)] * 20]])
def test_each_jump_is_the_float64_formula_within_float32_rounding(keep_norms, eta, mu, sizes, kernel_path):
    path, device = kernel_path
    gen = torch.Generator().manual_seed(len(sizes))
    scales = [10.0 ** (4 * (i % 3) - 4) for i in range(len(sizes))]  # 1e-4, 1, 1e4: norms differ by 10^8
    params = [(torch.randn(shape, generator=gen) * k).to(device) for shape, k in zip(sizes, scales)]
    anchor = [p + 0.01 * k * torch.randn(p.shape, generator=gen).to(device) for p, k in zip(params, scales)]
    noise = [0.005 * k * torch.randn(p.shape, generator=gen).to(device) for p, k in zip(params, scales)]
    momentum = [2 * (a - p) + n for p, a, n in zip(params, anchor, noise)]  # along the cycle: no restart
    rule = OuterMomentum(outer_lr=eta, outer_momentum=mu, keep_norms=keep_norms, verify_window=3)
    rule.setup(params, keep_jump=True)
    if mu > 0:
        torch._foreach_copy_(rule._b, momentum)
    inputs = [(w.clone(), a.clone(), b.clone()) for w, a, b in zip(params, anchor, momentum if mu > 0 else anchor)]
    planned = rule.jump(params, anchor)
    assert isinstance(planned, FusedJumpPlan) == (path == "fused")
    assert not planned.restart  # the momentum is along the cycle's displacement
    for (w, a, b), p, new_anchor, kept, b_got in zip(inputs, params, anchor, rule._before_jump, rule._b or params):
        new, b_new = reference(w, a, b if mu > 0 else torch.zeros_like(b), eta, mu, keep_norms)
        scale = w.double().abs() + a.double().abs() + (b.double().abs() if mu > 0 else 0)
        assert ((p.double() - new).abs() <= 8 * EPS * scale).all()
        assert torch.equal(new_anchor, p)
        assert torch.equal(kept, w)  # the weights before the jump, for its undo
        if mu > 0:
            assert ((b_got.double() - b_new).abs() <= 4 * EPS * scale).all()
    if keep_norms:  # each tensor keeps its norm, to float32's rounding
        for (w, _, _), p in zip(inputs, params):
            assert abs(p.double().norm() / w.double().norm() - 1) <= 4 * EPS
    rule.undo(params, anchor)  # at once: the weights and the anchor are the weights before the jump, bitwise
    assert all(torch.equal(p, w) and torch.equal(a, w) for (w, _, _), p, a in zip(inputs, params, anchor))
