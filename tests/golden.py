"""Golden runs: short fits that together cover every phase, a rollback, back-off, the learning-rate gate, offload,
the bandit, manual optimization, resume and DDP/FSDP, reduced to a hash of the final parameters and the run summary.

A refactor of the engine must leave every one of them bitwise equal. ``python -m tests.golden`` records them into
``tests/golden_run.json``; ``tests/test_golden.py`` replays them and compares. Floating-point kernels differ
between CPU instruction sets and torch builds, so the record names both and is compared only where they match.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.helpers import RegressionModel, flat_params, hybrid_trainer, loader, phases, scheduler_of
from tests.test_resume import _callbacks

RECORD = Path(__file__).with_name("golden_run.json")
V1_CHECKPOINT = Path(__file__).with_name("data") / "state_v1_mid_segment.ckpt"  # step 14, inside a segment
VOLATILE = ("wall_time_s", "time_by_phase_s")  # clock readings: not part of the behaviour


def platform() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernels": kernel_fingerprint(),
    }


def kernel_fingerprint() -> str:
    """The bits of a few kernels the runs use (a linear layer's forward and backward, tanh, a norm, an Adam step).
    Two processors of the same capability can still pick different matmul kernels (oneDNN chooses by the exact
    instruction set), and then every last bit differs while the behaviour is the same."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(65, 17)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(33, 65, generator=g)
    out = torch.tanh(layer(x))
    out.square().sum().backward()
    torch.optim.Adam(layer.parameters(), lr=1e-2).step()
    parts = [out, layer.weight.grad, layer.weight, torch.linalg.vector_norm(out, dim=1)]
    return digest(torch.cat([t.detach().flatten() for t in parts]))[:16]


def digest(params: torch.Tensor) -> str:
    return hashlib.sha256(params.detach().cpu().numpy().tobytes()).hexdigest()


def outcome(params: torch.Tensor, summary: dict[str, Any], phase_sequence: list[int] | None = None) -> dict[str, Any]:
    kept = {k: v for k, v in summary.items() if k not in VOLATILE}
    out = {"params_sha256": digest(params), "summary": json.loads(json.dumps(kept))}
    if phase_sequence is not None:
        out["phases"] = "".join(str(p) for p in phase_sequence)
    return out


def _fit(steps: int, model: RegressionModel, settings: dict[str, Any] | None = None, **kwargs: Any) -> dict:
    trainer, logger = hybrid_trainer(steps, settings, **kwargs)
    trainer.fit(model, loader())
    return outcome(flat_params(model), scheduler_of(trainer).summary(), list(phases(logger).values()))


def _fit_callbacks(kind: str, memory: str = "none", steps: int = 40) -> dict:
    trainer, logger = hybrid_trainer(steps, hybrid=_callbacks(kind, memory))
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32))
    return outcome(flat_params(model), scheduler_of(trainer).summary(), list(phases(logger).values()))


def _resume_v1(root: Path) -> dict:
    """Resume from a checkpoint written mid-segment by the scheduler before it was split into the engine's parts
    (state version 1): it must continue exactly as the uninterrupted run did (``rollback_offload``)."""
    trainer, _ = hybrid_trainer(40, hybrid=_callbacks("exploding", "offload"), logger=False, default_root_dir=root)
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=V1_CHECKPOINT)
    return outcome(flat_params(model), scheduler_of(trainer).summary())


def _resume(root: Path) -> dict:
    def run(ckpt_path: Path | None = None) -> tuple[RegressionModel, Any]:
        checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=2, filename="{step}")
        trainer, _ = hybrid_trainer(
            40,
            hybrid=_callbacks("exploding", "offload"),
            extra_callbacks=[checkpoint] if ckpt_path is None else [],
            enable_checkpointing=ckpt_path is None,
            logger=False,
            default_root_dir=root,
        )
        model = RegressionModel(scheduler=True)
        trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)
        return model, trainer

    run()
    model, trainer = run(root / "ckpt" / "step=14.ckpt")  # inside the second segment
    return outcome(flat_params(model), scheduler_of(trainer).summary())


def _ranks(root: Path, kind: str, strategy: str) -> dict:
    from tests.test_ddp import run_ranks

    rank0, rank1 = run_ranks(root, kind, strategy=strategy)
    assert torch.equal(rank0["params"], rank1["params"])
    return outcome(rank0["params"], rank0["summary"], rank0["phases"])


def scenarios(root: Path) -> dict[str, Callable[[], dict]]:
    return {
        "every_phase": lambda: _fit(60, RegressionModel()),
        "param_groups_sgd": lambda: _fit(60, RegressionModel(optimizer="sgd", param_groups=True, lr=0.05)),
        "manual_optimization": lambda: _fit(60, RegressionModel(automatic=False)),
        "forward_checks_every_2": lambda: _fit(60, RegressionModel(), {"predict_forward_every": 2}),
        "backoff": lambda: _fit(80, RegressionModel(), {"confidence_threshold": 1.0, "backoff_after": 1}),
        "lr_gate": lambda: _fit(80, RegressionModel(scheduler=True), {"predict_lr_fraction": 0.8}),
        "accumulate_grad_batches": lambda: _fit(30, RegressionModel(), accumulate_grad_batches=2),
        "rollback": lambda: _fit_callbacks("exploding"),
        "rollback_offload": lambda: _fit_callbacks("exploding", "offload"),
        "rollback_aggressive": lambda: _fit_callbacks("exploding", "aggressive"),
        "bandit_rssm": lambda: _fit_callbacks("rssm"),
        "bandit_mlp": lambda: _fit_callbacks("mlp"),
        "resume_mid_segment": lambda: _resume(root / "resume"),
        "resume_v1_checkpoint": lambda: _resume_v1(root / "resume_v1"),
        "ddp_accepting": lambda: _ranks(root / "ddp", "linear", "ddp"),
        "ddp_rolling_back": lambda: _ranks(root / "ddp_rb", "exploding", "ddp"),
        "fsdp_accepting": lambda: _ranks(root / "fsdp", "linear", "fsdp"),
    }


def run_all(names: list[str] | None = None) -> dict[str, dict]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        table = scenarios(Path(tmp))
        return {name: table[name]() for name in (names or table)}


if __name__ == "__main__":
    results = run_all(sys.argv[1:] or None)
    RECORD.write_text(json.dumps({"platform": platform(), "runs": results}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(results)} golden runs into {RECORD.name}")
