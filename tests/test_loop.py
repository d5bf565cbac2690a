"""The plugin in loops of one's own (``HybridLoop``): a plain PyTorch loop and a Fabric loop shaped like LitGPT's
pretraining, each ending bitwise as the callback's run of the same rule on the same batches; Fabric's DDP and FSDP2
ranks agreeing and resuming bitwise; its state riding in the optimizer's; what it refuses and says."""

from __future__ import annotations

import json
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.fabric.plugins import MixedPrecision
from torch.utils.data import DataLoader

from lightning_hybrid import HybridLoop, HybridScheduler
from lightning_hybrid.demos.gpt import GPT
from tests import fabric_loop, plain_loop
from tests.helpers import BESIDE, ROOT, free_port, script_env, trained, users_trainer

RULES = {"outer": BESIDE["default"], "gpa": BESIDE["gpa"]}


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


class _Plain(L.LightningModule):
    """The plain loop's training as a LightningModule."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gpt = GPT(**plain_loop.SIZE)

    def training_step(self, batch: tuple, idx: int) -> torch.Tensor:
        return self.gpt.loss(*batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class _Pretrain(L.LightningModule):
    """The Fabric loop's training as a LightningModule: the same model, optimizer and schedule."""

    def __init__(self) -> None:
        super().__init__()
        self.model = fabric_loop.new_model()

    def training_step(self, batch: tuple, idx: int) -> torch.Tensor:
        return self.model(*batch)

    def validation_step(self, batch: tuple, idx: int) -> None:
        self.model(*batch)

    def configure_optimizers(self) -> dict:
        optimizer = fabric_loop.instantiate_optimizer(fabric_loop.OPTIMIZER, self.parameters())
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: fabric_loop.get_lr(step) / fabric_loop.LR)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def test_a_plain_loop_imports_no_lightning_and_jumps():
    cmd = [sys.executable, "-m", "tests.plain_loop", "40"]
    done = subprocess.run(cmd, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"jumps_made": 4, "lightning": []}
    assert "hybrid (jumps, outer): 40 steps" in done.stdout  # the summary, said as the run ended


@pytest.mark.parametrize("rule", RULES)
def test_a_plain_loop_ends_bitwise_as_the_callbacks_run(rule):
    model, hybrid = plain_loop.train(40, **RULES[rule])
    module, scheduler = _Plain(), HybridScheduler(**RULES[rule])
    users_trainer([scheduler], steps=40).fit(module, DataLoader(plain_loop.batches(40), batch_size=None))
    assert _same(model, module.gpt)
    assert trained(hybrid.summary()) == trained(scheduler.summary())
    assert hybrid.summary().get("jumps_made", 1) >= 1 and hybrid.ended


@pytest.mark.parametrize("rule", RULES)
def test_a_litgpt_shaped_fabric_loop_ends_bitwise_as_the_callbacks_run(rule, tmp_path):
    """bf16 autocast, two micro-batches a step without the gradients' sync, clipping, a schedule set at each
    iteration, validation every 10 steps (at gpa's average) and a checkpoint; the Trainer does all of it itself."""
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    model, hybrid = fabric_loop.pretrain(fabric, RULES[rule], save=tmp_path / "step-12.ckpt")
    module, scheduler = _Pretrain(), HybridScheduler(**RULES[rule])
    trainer = users_trainer(
        [scheduler], steps=fabric_loop.STEPS, precision="bf16-mixed", accumulate_grad_batches=fabric_loop.ACCUMULATE,
        gradient_clip_val=fabric_loop.CLIP, val_check_interval=fabric_loop.EVAL * fabric_loop.ACCUMULATE,
        num_sanity_val_steps=0,
    )  # fmt: skip
    steps = fabric_loop.STEPS * fabric_loop.ACCUMULATE
    trainer.fit(
        module, *(DataLoader(b, batch_size=None) for b in (plain_loop.batches(steps), plain_loop.batches(2, seed=1)))
    )
    assert _same(model, module.model)
    assert trained(hybrid.summary()) == trained(scheduler.summary())


def test_a_fabric_loop_resumes_bitwise_from_fabric_save(tmp_path):
    """The checkpoint ``fabric.save`` wrote at step 12 (the plugin's state inside the optimizer's) resumes to the
    end the uninterrupted run reached, with a jump decided before it."""
    settings = RULES["outer"]
    whole, _ = fabric_loop.pretrain(L.Fabric(accelerator="cpu", devices=1), settings, save=tmp_path / "ckpt")
    resumed, hybrid = fabric_loop.pretrain(L.Fabric(accelerator="cpu", devices=1), settings, resume=tmp_path / "ckpt")
    assert _same(whole, resumed) and hybrid.summary()["jumps_made"] >= 2


def test_the_state_rides_in_a_plain_torch_save_of_the_optimizer(tmp_path):
    """A plain loop saves the optimizer's ``state_dict`` with ``torch.save`` and, in a new process's objects, loads it
    with ``weights_only``: the run goes on as if never stopped. Loaded before the plugin is built, torch would read
    the plugin's state as the optimizer's own (casting it): refused by name."""
    settings, steps = RULES["gpa"], 40
    whole, _ = plain_loop.train(steps, **settings)
    torch.manual_seed(0)
    model = GPT(**plain_loop.SIZE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    hybrid = HybridLoop(model, optimizer, max_steps=steps, **settings)
    for i, (x, y) in enumerate(plain_loop.batches(steps)):
        if i == 17:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "ckpt.pt")
            saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
            model, early = GPT(**plain_loop.SIZE), GPT(**plain_loop.SIZE)
            model.load_state_dict(saved["model"])
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
            hybrid = HybridLoop(model, optimizer, max_steps=steps, **settings)
            optimizer.load_state_dict(saved["optimizer"])
            loaded_first = torch.optim.AdamW(early.parameters(), lr=3e-3)
            loaded_first.load_state_dict(saved["optimizer"])
            with pytest.raises(ValueError, match=r"loaded before the plugin was built.*build HybridLoop first"):
                HybridLoop(early, loaded_first, **settings)
        loss = model.loss(x, y)
        hybrid.record_loss(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert _same(whole, model) and hybrid.step == steps


def test_a_compiled_module_trains_and_jumps_and_the_plain_rule_leaves_it_plain():
    """``torch.compile`` of the model, as LitGPT compiles it: jumps are made, and ``outer_lr=1, outer_momentum=0``
    ends bitwise as the same compiled loop without the plugin (a compiled module in Fabric and in a Trainer differ
    bitwise without any plugin, so this compares the loop with itself)."""
    fabric = L.Fabric(accelerator="cpu", devices=1)
    plain, _ = fabric_loop.pretrain(fabric, {}, compiled=True, plugin=False)
    identity = {**fabric_loop.JUMPING, "outer_lr": 1.0, "outer_momentum": 0.0}
    same, _ = fabric_loop.pretrain(fabric, identity, compiled=True)
    assert _same(plain, same)
    _, jumping = fabric_loop.pretrain(fabric, fabric_loop.JUMPING, compiled=True)
    assert jumping.summary()["jumps_made"] >= 2


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fabric_ranks_agree_and_resume_bitwise(strategy, tmp_path):
    """Two CPU ranks under Fabric's DDP, or FSDP2 (each rank its shards, its state saved per rank inside the
    distributed checkpoint): the ranks end with the same weights and summary, jumps made, and a run resumed from the
    ``fabric.save`` of step 12 ends bitwise as the uninterrupted one."""
    for mode in ("full", "resume"):
        cmd = [sys.executable, "-m", "tests.fabric_loop", strategy, str(tmp_path), mode]
        env = script_env(MASTER_PORT=str(free_port()))
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    ranks = {mode: [torch.load(tmp_path / f"{mode}-rank{r}.pt") for r in (0, 1)] for mode in ("full", "resume")}
    for zero, one in ranks.values():
        assert torch.equal(zero["params"], one["params"]) and trained(zero["summary"]) == trained(one["summary"])
    assert torch.equal(ranks["full"][0]["params"], ranks["resume"][0]["params"])
    assert ranks["full"][0]["summary"]["jumps_made"] >= 2


def test_what_a_loop_cannot_run_is_refused_and_a_forgotten_loss_is_said():
    model = GPT(**plain_loop.SIZE)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"predictor='linear' runs the per-step mode.*In a loop: 'outer' or 'gpa'"):
        HybridLoop(model, optimizer, predictor="linear")
    with pytest.raises(TypeError, match="HybridLoop: unknown setting `ful_steps`; did you mean `full_steps`"):
        HybridLoop(model, optimizer, ful_steps=3)
    scaled = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[scaled])
    with pytest.raises(ValueError, match="gradient scaler"):
        HybridLoop(*fabric.setup(GPT(**plain_loop.SIZE), torch.optim.AdamW(model.parameters())))
    hybrid = HybridLoop(model, optimizer, warmup_steps=0)
    x, y = plain_loop.batches(1)[0]
    with pytest.warns(UserWarning, match=r"step 1 stepped the optimizer with no loss recorded.*hybrid\.record_loss"):
        model.loss(x, y).backward()
        optimizer.step()
    assert hybrid.step == 0  # left alone: no step of the plugin's


def test_gpa_evaluates_at_the_average_and_a_loss_taken_there_is_refused():
    torch.manual_seed(0)
    again = GPT(**plain_loop.SIZE)
    optimizer = torch.optim.AdamW(again.parameters(), lr=3e-3)
    hybrid = HybridLoop(again, optimizer, **RULES["gpa"])
    for x, y in plain_loop.batches(12):
        loss = again.loss(x, y)
        hybrid.record_loss(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    training = [p.detach().clone() for p in again.parameters()]
    with hybrid.eval():
        assert not _same(again, _with(training))  # the average
        with pytest.raises(RuntimeError, match=r"gpa's average: leave `with hybrid.eval\(\):`"):
            hybrid.record_loss(again.loss(x, y))
    assert _same(again, _with(training))  # training goes on from its own point, bitwise


def _with(tensors: list[torch.Tensor]) -> torch.nn.Module:
    module = torch.nn.Module()
    for i, t in enumerate(tensors):
        module.register_parameter(f"p{i}", torch.nn.Parameter(t))
    return module


def test_scalars_reach_the_loops_logger_and_the_summary_is_said_at_max_steps(capsys):
    logged: list[tuple[dict, int]] = []
    plain_loop.train(12, **RULES["outer"], log=lambda m, s: logged.append((m, s)), log_every_n_steps=4)
    assert [s for _, s in logged] == [4, 8, 12] and {"hybrid/phase", "hybrid/loss"} <= set(logged[0][0])
    assert "hybrid (jumps, outer): 12 steps" in capsys.readouterr().out
