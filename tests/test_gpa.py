"""``gpa``, generalized primal averaging around the user's own optimizer: step by step what the paper's equations
give, evaluated at the average (validation, checkpoints, the end of ``fit``) without touching training, resumed
bitwise in every phase, and a skipped step leaves every sequence as it was (the two-rank runs are in
``tests/test_ddp.py``); each made eagerly, and by the fused kernel where Triton is installed (``kernel_path``)."""

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import hybrid_callbacks
from lightning_hybrid.engine.guard import StepGuard
from lightning_hybrid.predictors import PrimalAveraging, fused_blocks, gpa_fused, gpa_step
from tests.helpers import NanAt, RegressionModel, flat_params, hybrid_trainer, loader, scheduler_of

MU_X, MU_Y, LR, DECAY = 0.9, 0.7, 1e-2, 0.01  # an average short enough to move within a test's steps


class AdamWRegression(RegressionModel):
    """AdamW with weight decay, as users train."""

    def configure_optimizers(self):
        fused = self.optimizer_name == "fused_adam"  # guarded on the device: quiet steps
        return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=DECAY, fused=fused or None)


def _callbacks(**settings):
    return hybrid_callbacks(predictor=PrimalAveraging(mu_x=MU_X, mu_y=MU_Y), **{"warmup_steps": 0, **settings})


@pytest.fixture
def fused_steps(kernel_path, monkeypatch):
    """The steps the fused kernel made, how many it should make a step (0 on the eager path), and the Trainer
    arguments of the path's device."""
    path, device = kernel_path
    one = [torch.ones(1, device=device)]
    assert gpa_fused.usable(one, one, one) == (path == "fused")  # the check before training, made now: not counted
    made, average = [], gpa_fused.average
    monkeypatch.setattr(gpa_fused, "average", lambda *args: made.append(1) or average(*args))
    return made, int(path == "fused"), {"accelerator": "gpu" if device == "cuda" else "cpu"}


def _rule(trainer):
    return scheduler_of(trainer).predictor.predictor


class Watch(Callback):
    """The parameters after each step, and whether validation saw the average and training the training point."""

    def __init__(self):
        self.after_step, self.validated_at_average, self.trained_at_y = [], [], []

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        rule = _rule(trainer)
        if rule._set_up and scheduler_of(trainer).engine.family.started:
            y = [p.detach().clone() for p in pl_module.parameters()]
            rule.training_point(y)  # computed again from z and x
            self.trained_at_y.append(all(torch.equal(p, t) for p, t in zip(pl_module.parameters(), y)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
        self.after_step.append(flat_params(pl_module).cpu())

    def on_validation_batch_start(self, trainer, pl_module, batch, idx, dataloader_idx=0):
        x = _rule(trainer)._x
        self.validated_at_average.append(all(torch.equal(p, t) for p, t in zip(pl_module.parameters(), x)))


def paper_gpa(model, steps):
    """The paper's equations (arXiv 2512.17131, AdamW as the base), written out on a copy of ``model``: the gradient
    at y, Adam's moments, z's step with weight decay at y, then the averages. Returns y after each step and x."""
    params = list(model.parameters())
    y = [p.detach().clone() for p in params]
    z, x = [t.clone() for t in y], [t.clone() for t in y]
    m, v = [torch.zeros_like(t) for t in y], [torch.zeros_like(t) for t in y]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    batches, out = iter(loader()), []
    for t in range(1, steps + 1):
        inputs, targets = next(batches)
        with torch.no_grad():
            for p, value in zip(params, y):
                p.copy_(value)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        grads = torch.autograd.grad(loss, params)
        for i, g in enumerate(grads):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            step = (m[i] / (1 - beta1**t)) / ((v[i] / (1 - beta2**t)).sqrt() + eps) + DECAY * y[i]
            z[i] = z[i] - LR * step
            x[i] = MU_X * x[i] + (1 - MU_X) * z[i]
            y[i] = MU_Y * x[i] + (1 - MU_Y) * z[i]
        out.append(torch.cat([t.flatten() for t in y]))
    return out, torch.cat([t.flatten() for t in x])


def test_each_step_is_the_papers_equations_and_fit_hands_back_the_average(fused_steps):
    made, each, device = fused_steps
    watch = Watch()
    trainer, _ = hybrid_trainer(8, hybrid=_callbacks(), extra_callbacks=[watch], logger=False, **device)
    trainer.fit(model := AdamWRegression(), loader())
    expected, average = paper_gpa(AdamWRegression(), 8)
    for step, (got, want) in enumerate(zip(watch.after_step, expected, strict=True), 1):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m, s=step: f"step {s}: {m}")
    torch.testing.assert_close(flat_params(model).cpu(), average, rtol=1e-5, atol=1e-6)  # fit ends on x
    assert torch.equal(flat_params(model).cpu(), torch.cat([t.flatten() for t in _rule(trainer).state_dict()["x"]]))
    assert scheduler_of(trainer).summary()["averaged_steps"] == 8 and all(watch.trained_at_y)
    assert len(made) == 8 * each


def test_validation_sees_the_average_and_training_goes_on_as_without_it(fused_steps):
    _, _, device = fused_steps
    quiet, validated = Watch(), Watch()
    trainer, _ = hybrid_trainer(24, hybrid=_callbacks(), extra_callbacks=[quiet], logger=False, **device)
    trainer.fit(AdamWRegression(), loader())
    trainer, _ = hybrid_trainer(
        24, hybrid=_callbacks(), extra_callbacks=[validated], logger=False, val_check_interval=5, limit_val_batches=2,
        **device,
    )  # fmt: skip
    trainer.fit(AdamWRegression(), loader(), loader(64))
    assert validated.validated_at_average and all(validated.validated_at_average)
    assert all(torch.equal(a, b) for a, b in zip(quiet.after_step, validated.after_step, strict=True))
    assert all(validated.trained_at_y)


def _fit(root, steps, device, ckpt_path=None, every=8):
    checkpoints = ModelCheckpoint(root / "ckpt", every_n_train_steps=every, save_top_k=-1, filename="{step}")
    trainer, _ = hybrid_trainer(
        steps, hybrid=_callbacks(warmup_steps=10), extra_callbacks=[checkpoints], enable_checkpointing=True,
        logger=False, default_root_dir=root, **device,
    )  # fmt: skip
    trainer.fit(model := AdamWRegression(), loader(), ckpt_path=ckpt_path)  # 8 steps an epoch
    return model, trainer


@pytest.mark.parametrize("saved", ["step=8", "step=16"], ids=["warmup", "averaging"])
def test_a_checkpoint_holds_the_average_and_resumes_bitwise_in_every_phase(tmp_path, saved, fused_steps):
    made, each, device = fused_steps
    model, trainer = _fit(tmp_path / "full", 32, device)
    path = tmp_path / "full" / "ckpt" / f"{saved}.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    rule = next(v for k, v in checkpoint["callbacks"].items() if "DynamicsPredictor" in k)["predictor"]
    weights = list(checkpoint["state_dict"].values())
    assert all(torch.equal(w, x) for w, x in zip(weights, rule["x"] or weights, strict=True))  # x, once averaging
    assert bool(rule["x"]) == (saved == "step=16")
    resumed, again = _fit(tmp_path / "resumed", 32, device, ckpt_path=path)
    assert torch.equal(flat_params(resumed), flat_params(model))
    assert scheduler_of(again).summary()["averaged_steps"] == scheduler_of(trainer).summary()["averaged_steps"] == 22
    assert len(made) == (22 + {"step=8": 22, "step=16": 16}[saved]) * each  # the resumed fit averages from step 11


def test_a_skipped_step_leaves_every_sequence_as_it_was_on_the_host_and_on_the_device(monkeypatch, fused_steps):
    """A NaN loss at step 6: the weights, ``z`` and ``x`` after it are those before it, bitwise, whether the step
    was read on the host or guarded on the device (a fused Adam); the two runs end bitwise alike."""
    made, each, device = fused_steps

    def run():
        watch = Watch()
        trainer, _ = hybrid_trainer(12, hybrid=_callbacks(), extra_callbacks=[watch], logger=False, **device)
        trainer.fit(model := NanAt({5}, optimizer="fused_adam"), loader())
        return watch.after_step, flat_params(model), scheduler_of(trainer).summary()

    quiet_steps, quiet, summary = run()
    with monkeypatch.context() as patch:
        patch.setattr(StepGuard, "skips_on_device", lambda self, optimizer: False)
        host_steps, host, _ = run()
    assert torch.equal(quiet_steps[5], quiet_steps[4]) and not torch.equal(quiet_steps[6], quiet_steps[5])
    assert all(torch.equal(a, b) for a, b in zip(quiet_steps, host_steps, strict=True)) and torch.equal(quiet, host)
    assert summary["nonfinite_steps_skipped"] == 1 and summary["averaged_steps"] == 11
    assert len(made) == (12 + 11) * each  # a step skipped on the device is averaged with nothing kept


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"mu_x": 1.0}, r"PrimalAveraging: `mu_x` must be a finite number in \[0.0, "),
        ({"mu_y": 0}, r"`mu_y` .*\(0.0, 1.0\]"),
    ],
)
def test_bad_settings_are_refused_at_construction(settings, match):
    with pytest.raises(ValueError, match=match):
        PrimalAveraging(**settings)


def test_an_eager_averaging_step_is_fused_and_reads_nothing_to_the_host():
    """Eagerly, seven ``_foreach_`` operations and the kept flag's one scalar product, whatever the number of
    tensors, and no read to the host, which on a GPU would make the step wait."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    params = [torch.randn(5, 3) for _ in range(40)]
    rule = PrimalAveraging()
    rule.setup(params, keep_jump=False)
    rule.start(params)
    kept = torch.ones(())
    with Ops() as ops:
        rule.average(params, kept)
    assert sum(n.startswith("_foreach_") for n in ops.names) == 7 and len(ops.names) == 8
    assert not [n for n in ops.names if n.startswith(("_local_scalar_dense", "item", "_to_copy"))]


def test_the_fused_step_is_the_eager_step(fused_device):
    """The check each run makes before its first averaged step: within float32 rounding on tensors across a block's
    edge and of norms from 1e-6 to 1e6, a step not kept changes nothing, and the training point is the step's."""
    assert gpa_fused._agrees(torch.device(fused_device))


def test_the_eager_step_runs_where_the_kernel_does_not_serve_or_is_not_wanted(fused_device, monkeypatch):
    params = [torch.randn(3, device=fused_device), torch.randn(2, 2, device=fused_device)]
    for fused, path in [(True, gpa_fused), (False, gpa_step)]:
        rule = PrimalAveraging(fused=fused)
        rule.setup(params, keep_jump=False)
        rule.start(params)
        assert rule._path is path
    rule = PrimalAveraging()
    rule.setup([p.double() for p in params], keep_jump=False)
    rule.start(rule._like)
    assert rule._path is gpa_step
    monkeypatch.setattr(gpa_fused, "_agrees", lambda device: False)
    monkeypatch.setattr(fused_blocks, "_checked", {})
    with pytest.warns(UserWarning, match="the fused gpa step is not used on .*: its result differed"):
        rule = PrimalAveraging()
        rule.setup(params, keep_jump=False)
        rule.start(params)
    assert rule._path is gpa_step
