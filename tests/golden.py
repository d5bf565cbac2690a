"""Golden runs: short fits that together cover every phase, a rollback, back-off, the learning-rate gate, offload,
the bandit, manual optimization, resume (from checkpoints of earlier layouts too), DDP/FSDP and the trajectory
rules, each reduced to its behaviour (phases, rollback steps, the run summary, the per-step and validation losses)
and a hash of its final parameters.

A refactor of the engine must leave every one of them unchanged. Floating-point kernels differ between CPU
instruction sets and torch builds, so the comparison has three levels:

- everywhere: phases, counters, decisions and rollback reasons exactly; losses and other floats within
  ``REL_TOL`` relative (kernels that differ move the last bits, not the run);
- on a platform whose parameter hashes are recorded: the final parameters bitwise too;
- on the platform that recorded the floats: every float bitwise.

``python -m tests.golden`` records all runs on this machine (only on a commit whose behaviour is known to be
right); ``python -m tests.golden --add-platform`` checks this machine against the record and adds its parameter
hashes (under a longer name that adds the predictors' kernels where a machine of the same shorter name is recorded
already); ``python -m tests.golden NAME ...`` re-records only the runs named (on another platform than the record's,
each such run names the platform whose floats it holds).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hybrid import HybridScheduler, hybrid_callbacks
from tests.helpers import (
    DISTRIBUTED,
    SAME_RUN,
    RegressionModel,
    flat_params,
    hybrid_trainer,
    loader,
    phases,
    resume_callbacks,
    run_scenarios,
    scheduler_of,
)

RECORD = Path(__file__).with_name("golden_run.json")
DATA = Path(__file__).with_name("data")
V1_CHECKPOINT = DATA / "state_v1_mid_segment.ckpt"  # step 14, inside a segment (the scheduler before the engine)
VOLATILE = ("wall_time_s", "time_by_phase_s")  # clock readings: not part of the behaviour
REL_TOL = 1e-4  # floats on another platform: observed differences are below 3e-6 relative
# a jump every 6 steps after 4, of `outer` without the default's guards (recorded before they were its defaults)
OUTER = dict(predictor="outer", warmup_steps=4, full_steps=6, verify_window=3)
OUTER.update(keep_norms=False, restart=False, verify_resolution=0)
OUTER_REJECTING = dict(OUTER, outer_lr=1.5, outer_momentum=0.6)  # jumps rejected at once and after a delay
DEFAULT_RULE = dict(warmup_steps=4, full_steps=6, verify_window=3)  # the defaults, on short cycles
QUIET_LOGS = {"log_every_n_steps": 7}  # quiet steps are read at logging steps: most checkpoints hold unread ones


def platform() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernels": kernel_fingerprint(),
        "predictor_kernels": predictor_fingerprint(),
    }


def platform_key(known: Iterable[str] = ()) -> str:
    """The platform's name in the record: torch, capability and kernels; with the predictors' kernels appended
    where the record knows a platform by that longer name (one that shares the shorter name with an earlier one)."""
    p = platform()
    key = f"{p['torch']}/{p['cpu_capability']}/{p['kernels']}"
    longer = f"{key}/{p['predictor_kernels']}"
    return longer if longer in known else key


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


def predictor_fingerprint() -> str:
    """The bits of the predictors' own kernels (the bandit's float64 solve, vectorised and scalar exponentials and
    logarithms, a batched matmul with a sigmoid) and the processor's vendor, by which the math libraries dispatch:
    two machines of the same capability and the same layer kernels have still ended the per-step predictors' error
    statistics a few bits apart, and an ``rssm`` run's weights with them."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(7, 7, generator=g, dtype=torch.float64)
    x = torch.randn(997, generator=g)
    members = torch.randn(3, 9, 13, generator=g) @ torch.randn(3, 13, 5, generator=g)
    scalars = torch.tensor([f(v) for v in x[:64].abs().tolist() for f in (math.exp, math.log, math.sqrt)])
    solved = torch.linalg.solve(a @ a.T + torch.eye(7, dtype=torch.float64), a[:, 0])
    vendor = next((line for line in _cpuinfo() if line.startswith("vendor_id")), "")
    bits = b"".join(t.numpy().tobytes() for t in (solved, scalars, x.exp(), members.sigmoid()))
    return hashlib.sha256(bits + vendor.encode()).hexdigest()[:16]


def _cpuinfo() -> list[str]:
    info = Path("/proc/cpuinfo")
    return info.read_text().splitlines() if info.exists() else []


def digest(params: torch.Tensor) -> str:
    return hashlib.sha256(params.detach().cpu().numpy().tobytes()).hexdigest()


def outcome(params: torch.Tensor, summary: dict[str, Any], logger: Any = None, phase_list: list[int] | None = None):
    """A run's behaviour and its parameters' hash. ``logger``: the run's :class:`MemoryLogger`, whose phases,
    rollback steps and losses join the behaviour."""
    kept = {k: v for k, v in summary.items() if k not in VOLATILE}
    behaviour: dict[str, Any] = {"summary": json.loads(json.dumps(kept)), "params_norm": float(params.norm())}
    if logger is not None:
        phase_list = [int(p) for p in phases(logger).values()]
        rollbacks = logger.series("hybrid/rollbacks") or logger.series("hybrid/jumps_undone")  # per-step or jumps
        rollbacks = {s + 1: v for s, v in rollbacks.items()}  # by the step that ended: Lightning logs one before
        behaviour["rollback_steps"] = [s for s, v in rollbacks.items() if v > rollbacks.get(s - 1, 0.0)]
        behaviour["losses"] = [v for v in logger.series("hybrid/loss").values() if math.isfinite(v)]
        behaviour["val_losses"] = list(logger.series("val_loss").values())
    if phase_list is not None:
        behaviour["phases"] = "".join(str(p) for p in phase_list)
    return {"behaviour": behaviour, "params_sha256": digest(params)}


def _fit(steps: int, model: RegressionModel, settings: dict[str, Any] | None = None, **kwargs: Any) -> dict:
    trainer, logger = hybrid_trainer(steps, settings, **kwargs)
    trainer.fit(model, loader())
    return outcome(flat_params(model), scheduler_of(trainer).summary(), logger)


def _fit_callbacks(kind: str, memory: str = "none", steps: int = 40) -> dict:
    trainer, logger = hybrid_trainer(steps, hybrid=resume_callbacks(kind, memory))
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32))
    return outcome(flat_params(model), scheduler_of(trainer).summary(), logger)


def _rule(settings: dict[str, Any], steps: int = 80, lr: float = 3e-2) -> dict:
    trainer, logger = hybrid_trainer(
        steps, hybrid=hybrid_callbacks(**settings), val_check_interval=10, check_val_every_n_epoch=None
    )
    model = RegressionModel(lr=lr)
    trainer.fit(model, loader(), loader(64, seed=2))
    return outcome(flat_params(model), scheduler_of(trainer).summary(), logger)


def checkpointed_run(
    root: Path, hybrid: list, ckpt_path: Path | None = None, model: dict | None = None, trainer: dict | None = None
) -> dict:
    """A 40-step run of 2 batches per epoch that checkpoints every epoch end (or resumes from ``ckpt_path``)."""
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=2, filename="{step}")
    fit, logger = hybrid_trainer(
        40,
        hybrid=hybrid,
        extra_callbacks=[checkpoint] if ckpt_path is None else [],
        enable_checkpointing=ckpt_path is None,
        default_root_dir=root,
        **(trainer or {}),
    )
    module = RegressionModel(**{"scheduler": True, **(model or {})})
    fit.fit(module, loader(64, batch_size=32), ckpt_path=ckpt_path)
    return outcome(flat_params(module), scheduler_of(fit).summary(), logger)


# Checkpoints written by earlier code (tests/data/README.md), each with the run that resumes it: (the hybrid
# callbacks, the model's and the Trainer's arguments). Every layout a landed commit wrote must resume. `v1`: the
# scheduler before the engine; `v1_engine`: the engine assembled from mixins; `v2`: the release before this default.
FIXTURES: dict[str, tuple[Callable[[], list], dict[str, Any], dict[str, Any]]] = {
    "state_v1_mid_segment.ckpt": (lambda: resume_callbacks("exploding", "offload"), {}, {}),
    "state_v1_engine_outer_jump_due.ckpt": (lambda: hybrid_callbacks(**OUTER_REJECTING), {"lr": 3e-2}, {}),
    "state_v1_engine_outer_pending.ckpt": (lambda: hybrid_callbacks(**OUTER_REJECTING), {"lr": 3e-2}, {}),
    "state_v1_engine_deferred.ckpt": (lambda: resume_callbacks("linear"), {"optimizer": "fused_adam"}, QUIET_LOGS),
    # state version 2, written before `outer` with its guards became the default: both modes resume
    "state_v2_outer_guarded_pending.ckpt": (
        lambda: hybrid_callbacks(**DEFAULT_RULE, verify_resolution=0),
        {"lr": 1e-2},
        {},
    ),
    "state_v2_linear_mid_segment.ckpt": (lambda: resume_callbacks("linear"), {}, {}),
    # state version 3, the last whose scheduler placed its components among the Trainer's callbacks (each
    # checkpointed on its own): the scheduler alone beside Lightning's strategy, the default rule and gpa
    "state_v3_alone_outer_pending.ckpt": (
        lambda: [HybridScheduler(**DEFAULT_RULE, verify_resolution=0)],
        {"lr": 1e-2},
        {"strategy": "auto"},
    ),
    "state_v3_alone_gpa.ckpt": (
        lambda: [HybridScheduler(predictor="gpa", warmup_steps=4, full_steps=6)],
        {"lr": 1e-2},
        {"strategy": "auto"},
    ),
}


def _resume_fixture(root: Path, name: str) -> dict:
    hybrid, model, trainer = FIXTURES[name]
    return checkpointed_run(root, hybrid(), DATA / name, model, trainer)


def _resume(root: Path, hybrid: Callable[[], list], step: int, **model: Any) -> dict:
    checkpointed_run(root, hybrid(), model=model)
    return checkpointed_run(root, hybrid(), root / "ckpt" / f"step={step}.ckpt", model=model)


# the two-rank golden runs: each a scenario of tests/helpers.DISTRIBUTED, which the suite launches once for all
RANKS = {
    "ddp_accepting": "linear",
    "ddp_rolling_back": "exploding",
    "ddp_outer": "outer",
    "fsdp_accepting": "linear-fsdp",
}


def ranks_outcome(ranks: list[dict]) -> dict:
    """The golden record of a two-rank scenario's ranks (:func:`~tests.helpers.run_scenarios`), which must agree."""
    rank0, rank1 = ranks
    assert torch.equal(rank0["params"], rank1["params"])
    return outcome(rank0["params"], rank0["summary"], phase_list=rank0["phases"])


def _ranks(root: Path, name: str) -> dict:
    scenario = RANKS[name]
    return ranks_outcome(run_scenarios(root, {name: DISTRIBUTED[SAME_RUN.get(scenario, scenario)]})[name])


def scenarios(root: Path) -> dict[str, Callable[[], dict]]:
    fixtures = {f"resume_{name.removesuffix('.ckpt')}": name for name in FIXTURES}
    return {
        "every_phase": lambda: _fit(60, RegressionModel()),
        "param_groups_sgd": lambda: _fit(60, RegressionModel(optimizer="sgd", param_groups=True, lr=0.05)),
        "manual_optimization": lambda: _fit(60, RegressionModel(automatic=False)),
        "forward_checks_every_2": lambda: _fit(60, RegressionModel(), {"predict_forward_every": 2}),
        "backoff": lambda: _fit(80, RegressionModel(), {"confidence_threshold": 1.0, "backoff_after": 1}),
        "lr_gate": lambda: _fit(80, RegressionModel(scheduler=True), {"predict_lr_fraction": 0.8}),
        "accumulate_grad_batches": lambda: _fit(30, RegressionModel(), accumulate_grad_batches=2),
        "quiet_fused_adam": lambda: _fit(60, RegressionModel(optimizer="fused_adam")),
        "rollback": lambda: _fit_callbacks("exploding"),
        "rollback_offload": lambda: _fit_callbacks("exploding", "offload"),
        "rollback_aggressive": lambda: _fit_callbacks("exploding", "aggressive"),
        "bandit_rssm": lambda: _fit_callbacks("rssm"),
        "bandit_mlp": lambda: _fit_callbacks("mlp"),
        "outer_accepting": lambda: _rule(OUTER, lr=1e-2),
        "outer_rejecting": lambda: _rule(OUTER_REJECTING),
        "outer_unverified": lambda: _rule(dict(OUTER, verify_window=0)),
        "default_rule": lambda: _rule(DEFAULT_RULE),  # some cycles too noisy to judge: those make no jump
        "default_rule_judging": lambda: _rule(dict(DEFAULT_RULE, verify_resolution=0), lr=1e-2),
        "resume_mid_segment": lambda: _resume(root / "resume", lambda: resume_callbacks("exploding", "offload"), 14),
        "resume_outer_pending": lambda: _resume(
            root / "outer", lambda: hybrid_callbacks(**OUTER_REJECTING), 30, lr=3e-2
        ),
        **{key: (lambda name=name: _resume_fixture(root / name, name)) for key, name in fixtures.items()},
        **{name: (lambda name=name: _ranks(root, name)) for name in RANKS},
    }


def run_all(names: list[str] | None = None) -> dict[str, dict]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        table = scenarios(Path(tmp))
        return {name: table[name]() for name in (names or table)}


def differences(want: Any, got: Any, exact_floats: bool, path: str = "") -> list[str]:
    """Where ``got`` departs from ``want``: any non-float value, or a float beyond ``REL_TOL`` (bitwise with
    ``exact_floats``), a tensor bitwise. A float equal to an int (a counter summed as a float) compares as a
    number."""
    if isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor):
        same = isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and torch.equal(want, got)
        return [] if same else [f"{path}: tensors differ"]
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}/{k}: only in the record" for k in want.keys() - got.keys()]
        out += [f"{path}/{k}: not in the record" for k in got.keys() - want.keys()]
        for k in sorted(want.keys() & got.keys()):
            out += differences(want[k], got[k], exact_floats, f"{path}/{k}")
        return out
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(want) != len(got):
            return [f"{path}: {len(got)} values, recorded {len(want)}"]
        return [d for i, (w, g) in enumerate(zip(want, got)) for d in differences(w, g, exact_floats, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, float) and not exact_floats:
        same = math.isclose(want, got, rel_tol=REL_TOL, abs_tol=1e-9) or (math.isnan(want) and math.isnan(got))
        return [] if same else [f"{path}: {got!r}, recorded {want!r} (tolerance {REL_TOL} relative)"]
    return [] if want == got or (want != want and got != got) else [f"{path}: {got!r}, recorded {want!r}"]


def _add_platform(record: dict) -> None:
    """Adds this machine's hashes; by the longer name where the shorter one is another machine's."""
    key = platform_key(record["platforms"])
    if key in record["platforms"]:
        key = f"{key}/{platform()['predictor_kernels']}"
    results = run_all()
    wrong = {
        n: d for n, r in results.items() if (d := differences(record["runs"][n]["behaviour"], r["behaviour"], False))
    }
    if wrong:
        sys.exit(f"not added: this machine's behaviour differs from the record: {wrong}")
    for name, result in results.items():
        record["runs"][name]["params_sha256"][key] = result["params_sha256"]
    record["platforms"][key] = platform()


if __name__ == "__main__":
    args = sys.argv[1:]
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {"platforms": {}, "runs": {}}
    if args == ["--add-platform"]:
        _add_platform(record)
    else:
        key, results = platform_key(record["platforms"]), run_all(args or None)
        if not args:
            record = {"platforms": {}, "runs": {}}
            record["recorded_on"] = key
        record["platforms"][key] = platform()
        for name, result in results.items():
            run = {"behaviour": result["behaviour"], "params_sha256": {key: result["params_sha256"]}}
            if key != record["recorded_on"]:  # a run's floats are exact on the platform that recorded them
                run["recorded_on"] = key
            record["runs"][name] = run
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(
        f"{len(record['runs'])} golden runs in {RECORD.name}, parameter hashes for {len(record['platforms'])} platforms"
    )
