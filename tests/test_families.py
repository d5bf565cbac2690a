"""Prediction families behind one interface: a new family is one module (a rule and a family class) that runs
through ``Trainer.fit`` with no engine edit; the engine reaches every family through that interface and its
components through their protocols, which test doubles written to the protocols alone satisfy."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import lightning_hybrid.predictors as predictors
from lightning_hybrid import DynamicsPredictor, HybridConfig, HybridScheduler, hybrid_callbacks
from lightning_hybrid.engine import FAMILIES, PredictionFamily, register_family
from lightning_hybrid.predictors import LinearPredictor, OuterMomentum, TrajectoryRule
from tests.helpers import (
    FAST_PHASES,
    RULE_PHASES,
    RegressionModel,
    bare_engine,
    bare_step,
    flat_params,
    hybrid_trainer,
    loader,
    scheduler_of,
)

ENGINE = Path(__file__).resolve().parents[1] / "lightning_hybrid" / "engine"

# ------------------------------------------------------------------------------------------------ a toy family


class Still(TrajectoryRule):
    """A rule that never moves the weights: all its family does is count the Full cycles it saw end."""

    name = "still"
    family = "still"

    def setup(self, params, keep_jump):
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@register_family
class StillFamily(PredictionFamily):
    name = "still"
    gated = False

    def __init__(self, engine):
        super().__init__(engine)
        self.cycles = 0

    def cycle_end(self) -> None:
        self.cycles += 1

    def summary(self) -> dict[str, Any]:
        return {"cycles_seen": self.cycles}

    def state_dict(self) -> dict[str, Any]:
        return {"cycles": self.cycles}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cycles = int(state["cycles"])


def _still_run(root: Path, ckpt_path: Path | None = None):
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_train_steps=2, filename="{step}")
    trainer, logger = hybrid_trainer(
        40,
        hybrid=hybrid_callbacks(predictor=Still(), **RULE_PHASES),
        extra_callbacks=[checkpoint] if ckpt_path is None else [],
        enable_checkpointing=ckpt_path is None,
        default_root_dir=root,
    )
    model = RegressionModel(scheduler=True)
    trainer.fit(model, loader(64, batch_size=32), ckpt_path=ckpt_path)
    return model, trainer, logger


def test_a_new_family_runs_through_fit_with_no_engine_edit(tmp_path):
    model, trainer, logger = _still_run(tmp_path / "still")
    plain = RegressionModel(scheduler=True)
    L.Trainer(max_steps=40, logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu").fit(
        plain, loader(64, batch_size=32)
    )
    assert torch.equal(flat_params(model), flat_params(plain))  # it never moved the weights: plain, bitwise
    summary = scheduler_of(trainer).summary()
    assert summary["mode"] == "still" and summary["predictor"] == "still"
    assert summary["cycles_seen"] == (40 - 5) // 6  # its own counter, through the interface
    assert summary["backward_passes"] == 40
    assert len(logger.series("hybrid/phase")) == 40 and not logger.series("hybrid/confidence")  # no scalar of its own
    resumed, resumed_trainer, _ = _still_run(tmp_path / "resumed", tmp_path / "still" / "ckpt" / "step=20.ckpt")
    assert torch.equal(flat_params(resumed), flat_params(model))
    assert scheduler_of(resumed_trainer).summary()["cycles_seen"] == summary["cycles_seen"]  # its state resumed


def test_a_predictor_of_an_unregistered_family_is_refused_by_name():
    class Orphan(Still):
        name = "orphan"
        family = "nowhere"

    with pytest.raises(ValueError, match="Orphan names the prediction family 'nowhere', which is not registered"):
        hybrid_callbacks(predictor=Orphan())
    trainer, _ = hybrid_trainer(5, hybrid=[HybridScheduler(), DynamicsPredictor(Orphan())])
    with pytest.raises(MisconfigurationException, match="'nowhere', which is not registered"):
        trainer.fit(RegressionModel(), loader())


def test_a_family_refuses_what_it_cannot_run_with_before_training():
    """Each family's own check, by name: the bandit with a family that makes no segments, a window longer than
    outer's cycle."""
    trainer, _ = hybrid_trainer(5, hybrid=hybrid_callbacks(predictor=Still(), bandit=True))
    with pytest.raises(MisconfigurationException, match="HorizonBandit has nothing to choose"):
        trainer.fit(RegressionModel(), loader())
    trainer, _ = hybrid_trainer(5, hybrid=hybrid_callbacks(predictor="outer", full_steps=4, verify_window=5))
    with pytest.raises(MisconfigurationException, match="`verify_window` must be at most full_steps"):
        trainer.fit(RegressionModel(), loader())


def test_the_built_in_families_are_registered_by_their_predictors():
    assert {cls.family for cls in predictors.PREDICTORS.values()} == {"segments", "jumps", "averaging"}
    assert {"segments", "jumps", "averaging"} <= set(FAMILIES)


# ------------------------------------------------------------------------------------------------ no type branches


def _concrete_predictor_classes() -> set[str]:
    return {name for name in predictors.__all__ if isinstance(getattr(predictors, name), type)}


def _isinstance_targets(path: Path) -> set[str]:
    """Names that ``isinstance`` calls in ``path`` test against."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            target = node.args[1]
            for elt in target.elts if isinstance(target, ast.Tuple) else [target]:
                found.add(ast.unparse(elt).split(".")[-1])
    return found


def test_no_engine_module_branches_on_a_predictor_or_rule_class():
    classes = _concrete_predictor_classes()
    assert {"OuterMomentum", "LinearPredictor", "TrajectoryRule"} <= classes
    hits = {p.relative_to(ENGINE): _isinstance_targets(p) & classes for p in ENGINE.rglob("*.py")}
    branches = {f"{path}: {sorted(names)}" for path, names in hits.items() if names}
    assert not branches, branches


def test_the_branch_check_sees_a_branch(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(rule):\n    return isinstance(rule, (rules.OuterMomentum, int))\n")
    assert "OuterMomentum" in _isinstance_targets(module) & _concrete_predictor_classes()


# ------------------------------------------------------------------------------------------------ protocol doubles


class MonitorDouble:
    """The :class:`~lightning_hybrid.engine.Monitor` protocol and nothing else: accepts whatever is finite and
    counts what it is asked."""

    def __init__(self) -> None:
        self.events = {"nonfinite": 0, "delayed": 0}
        self.calls: dict[str, int] = {}

    def _called(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def observe(self, loss: float, grad_norm: float) -> None:
        self._called("observe")

    def gradient_outlier(self, grad_norm: float) -> bool:
        self._called("gradient_outlier")
        return False

    def outlier_limit(self) -> float:
        return math.inf

    def start_segment(self) -> None:
        self._called("start_segment")

    def check(self, loss: float, upper_bound: float) -> str | None:
        self._called("check")
        return None if math.isfinite(loss) else "nonfinite"

    def diverged(self, loss: float) -> str | None:
        self._called("diverged")
        return None

    def judge_window(self, before: float, after: float, tolerance: float) -> str | None:
        self._called("judge_window")
        return "delayed"  # rejects every jump


@pytest.mark.parametrize(
    ("predictor", "settings", "expected"),
    [
        (LinearPredictor(), dict(FAST_PHASES, predict_forward_every=0), {"check", "start_segment", "observe"}),
        (OuterMomentum(verify_window=3, verify_resolution=0.0), RULE_PHASES, {"diverged", "judge_window", "observe"}),
    ],
    ids=["segments", "jumps"],
)
def test_every_family_runs_on_a_monitor_written_to_the_protocol(predictor, settings, expected):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    monitor = MonitorDouble()
    config = HybridConfig(**settings)
    engine = bare_engine(config, predictor, optimizer, monitor)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(1, 41):
        bare_step(engine, optimizer, lambda: torch.nn.functional.mse_loss(model(x), y), step)
    engine.end_fit()
    assert expected <= set(monitor.calls), monitor.calls
    summary = engine.summary()
    assert summary["mode"] == engine.family.mode and all(torch.isfinite(p).all() for p in model.parameters())
    if predictor.family == "jumps":  # every jump made was rejected by the double's verdict, or at the end of fit
        assert summary["jumps_made"] > 0 and summary["jumps_undone"] == summary["jumps_made"]
    if predictor.family == "segments":
        assert summary["segments_started"] > 0 and summary["segments_accepted"] > 0


def _used_on(role: str) -> set[str]:
    """Attributes the engine's modules read of ``parts.<role>`` (or a local of that name)."""
    used = set()
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value).split(".")[-1] == role:
                used.add(node.attr)
    return used


@pytest.mark.parametrize("role", ["monitor", "corrector", "bandit"])
def test_each_protocol_lists_everything_the_engine_uses_of_its_component(role):
    from lightning_hybrid.engine import components

    protocol = {"monitor": components.Monitor, "corrector": components.Corrector, "bandit": components.Bandit}[role]
    declared = {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)
    used = _used_on(role)
    assert used, f"nothing found for {role}: the scan is broken"
    assert used <= declared, sorted(used - declared)
