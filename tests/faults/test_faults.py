"""Fault injection: every run finishes, no NaN/Inf reaches the weights, and after a transient fault the final
validation loss is at most 2% above that of the same run without it. (One-sided: any change of trajectory, a
rollback or a skipped step, moves this small task's final loss by up to about 2.5% either way, and ending lower
is not harm.) Each case records what it tried and what happened (``record_property``); ``python -m
tests.faults.table`` turns the JUnit XML of a run into the table in docs/reliability.md."""

import json
import math
import signal
from pathlib import Path

import lightning as L
import pytest
import torch

from lightning_hybrid import (
    DivergenceMonitor,
    DynamicsPredictor,
    HybridScheduler,
    Phase,
    ResidualCorrector,
    hybrid_callbacks,
)
from lightning_hybrid.predictors import LinearPredictor, Plan
from tests.faults.common import MODES, FailAt, FaultyModel, FiniteWatch, record, train
from tests.faults.kill_worker import (
    CYCLE_STEPS,
    DEFAULT_SHORT,
    KILL_AFTER,
    POINTS,
    WRITING,
    first_at_each_point,
    run,
)
from tests.faults.kill_worker import cycle_run as cycle_run_of
from tests.golden import differences
from tests.helpers import (
    FAST_PHASES,
    RegressionModel,
    by_step,
    flat_params,
    hybrid_trainer,
    loader,
    scheduler_of,
    step_of,
)

REFERENCE: dict[str, float] = {}
MODE_NAMES = sorted(MODES)  # "default" (the `outer` rule, jumping on short cycles) and "per-step"
PER_STEP_PHASES = [("per-step", Phase.PREDICT), ("per-step", Phase.CORRECT)]


def reference_val(mode: str = "per-step") -> float:
    if mode not in REFERENCE:
        REFERENCE[mode] = train(mode=mode)[3]
    return REFERENCE[mode]


def _caught(trainer) -> str:
    """What a mode did about a fault: the jumps undone or segments rolled back, and the steps skipped."""
    s = scheduler_of(trainer).summary()
    undone = f"{s['jumps_undone']} jump(s) undone" if "jumps_made" in s else f"{s['rollbacks']} rollback(s)"
    return f"{undone}, {s['nonfinite_steps_skipped'] + s['outlier_steps_skipped']} step(s) skipped"


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize(("mode", "phase"), [(m, Phase.FULL) for m in MODE_NAMES] + PER_STEP_PHASES)
def test_nonfinite_loss(record_property, kind, mode, phase):
    model, trainer, watch, val = train({(phase, 3): kind}, mode=mode)
    counters = scheduler_of(trainer).counters
    assert model.injected and model.injected[0][1] is phase
    assert watch.steps == trainer.global_step and watch.all_finite
    ratio = val / reference_val(mode)
    assert ratio < 1.02, ratio
    assert counters.rollbacks + counters.nonfinite_steps_skipped >= 1
    where = "predicted-step forward check" if phase is Phase.PREDICT else f"{phase.label} step"
    fault = {"nan": "NaN", "inf": "Inf"}[kind] + " loss"
    record(record_property, fault, where, f"{_caught(trainer)}; final val loss within 2% of the clean run", mode)


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("kind", ["spike", "explosion"])
def test_loss_spike_and_gradient_explosion(record_property, kind, mode):
    model, trainer, watch, val = train({(Phase.FULL, 30): kind}, mode=mode)  # once the gradient statistics are warm
    counters = scheduler_of(trainer).counters
    assert model.injected and watch.all_finite
    ratio = val / reference_val(mode)
    assert ratio < 1.02, ratio
    assert counters.outlier_steps_skipped == (kind == "explosion")  # a x10 spike is still training
    fault = "loss spike (x10)" if kind == "spike" else "gradient explosion (loss x1e6)"
    record(record_property, fault, "full step", f"{_caught(trainer)}; final val loss within 2% of the clean run", mode)


class AtSteps(RegressionModel):
    """Injects ``at[global_step]`` into the step that starts at that global step: a ``nan`` or ``inf`` loss, or an
    ``explosion`` (the loss, hence the gradients, x1e6)."""

    def __init__(self, at: dict[int, str]) -> None:
        super().__init__(scheduler=True)
        self.at, self.injected = at, []

    def training_step(self, batch, batch_idx):
        kind = self.at.get(self.trainer.global_step)
        if kind is not None:
            self.injected.append(self.trainer.global_step)
        loss = super().training_step(batch, batch_idx)
        return loss * {"nan": math.nan, "inf": math.inf, "explosion": 1e6}.get(kind, 1.0)


class Jumps(L.Callback):
    """The global steps after which the default rule jumped, kept a jump and undid one."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.kept: list[int] = []
        self.undone: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, *args):
        summary = scheduler_of(trainer).summary()
        for seen, key in ((self.made, "jumps_made"), (self.kept, "jumps_kept"), (self.undone, "jumps_undone")):
            if summary[key] > len(seen):
                seen.append(trainer.global_step)


def _jumps(model: L.LightningModule) -> tuple[Jumps, L.Trainer, FiniteWatch]:
    jumps, watch = Jumps(), FiniteWatch()
    hybrid = hybrid_callbacks(**MODES["default"])
    trainer, _ = hybrid_trainer(STEPS_AROUND, hybrid=hybrid, extra_callbacks=[jumps, watch], logger=False)
    trainer.fit(model, loader())
    return jumps, trainer, watch


STEPS_AROUND = 120  # a few cycles past the first jumps


@pytest.mark.parametrize("kind", ["nan", "inf", "explosion"])
@pytest.mark.parametrize("where", ["the first step after a jump", "inside the jump's verdict window"])
def test_a_fault_right_after_a_jump_is_skipped_and_the_jump_judged_by_the_steps_that_stay(record_property, kind, where):
    """The default's own window: a non-finite loss or an exploding gradient on the first step after a jump, or
    inside the window whose losses judge it. The run finishes and no non-finite value reaches the weights; the
    faulty step's update is skipped (counted); the jump gets the verdict the clean run gave it (the skipped step's
    loss is no evidence for or against it), and every jump is judged by the end of fit."""
    clean = _jumps(RegressionModel(scheduler=True))[0]
    jumped = clean.made[1]  # the second jump: the gradient statistics are warm
    full, window = MODES["default"]["full_steps"], MODES["default"]["verify_window"]
    verdict = jumped + full - 1  # the step after which the jump is kept, or undone
    at = jumped if where.startswith("the first") else verdict - window + 1
    model = AtSteps({at: kind})
    jumps, trainer, watch = _jumps(model)
    summary = scheduler_of(trainer).summary()
    assert model.injected == [at] and watch.all_finite and watch.steps == STEPS_AROUND
    assert summary["nonfinite_steps_skipped"] + summary["outlier_steps_skipped"] == 1
    assert (verdict in jumps.kept, verdict in jumps.undone) == (verdict in clean.kept, verdict in clean.undone)
    assert (verdict in jumps.kept) != (verdict in jumps.undone)  # judged, one way
    assert summary["jumps_made"] == summary["jumps_kept"] + summary["jumps_undone"]
    fault = {"nan": "NaN loss", "inf": "Inf loss", "explosion": "gradient explosion (loss x1e6)"}[kind]
    judged = "kept" if verdict in jumps.kept else "undone"
    outcome = f"{_caught(trainer)}; the jump {judged}, as in the clean run; {summary['jumps_kept']} of "
    record(record_property, fault, where, outcome + f"{summary['jumps_made']} jumps kept", "default")


class Garbage(LinearPredictor):
    """Plans that are huge, NaN, or shaped unlike the parameters."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def plan(self, horizon: int, features=None) -> Plan:
        plan = super().plan(horizon, features)
        if self.kind == "huge":
            plan.scales = [[s * 1e6 for s in row] for row in plan.scales]
        return plan

    def directions(self):
        dirs = super().directions()
        if self.kind == "nan":
            return [[torch.full_like(t, math.nan) for t in group] for group in dirs]
        if self.kind == "wrong shapes":
            return [[t.flatten()[:-1] for t in group] for group in dirs]
        return dirs


@pytest.mark.parametrize("kind", ["huge", "nan", "wrong shapes"])
def test_garbage_predictor_is_caught_and_prediction_switched_off(record_property, kind):
    scheduler = HybridScheduler(**FAST_PHASES, max_consecutive_rollbacks=3)
    hybrid = [scheduler, DynamicsPredictor(Garbage(kind)), ResidualCorrector(), DivergenceMonitor()]
    _, _, watch, val = train(hybrid=hybrid)
    counters = scheduler.counters
    failed = counters.rollbacks + counters.invalid_plans
    assert watch.all_finite and failed == 3 and scheduler.summary()["prediction_disabled"]
    plain = train(settings={"enable_prediction": False})[3]
    ratio = val / plain
    assert ratio < 1.02, ratio
    outcome = (
        f"{counters.rollbacks} rolled back, {counters.invalid_plans} refused before touching the weights; "
        "prediction off after 3; final val loss within 2% of plain training"
    )
    what = {"huge": "huge updates", "nan": "NaN updates", "wrong shapes": "updates of the wrong shapes"}[kind]
    record(record_property, f"predictor returns {what}", "plan", outcome)


@pytest.mark.parametrize(("mode", "phase"), [(m, Phase.FULL) for m in MODE_NAMES] + PER_STEP_PHASES[:1])
def test_corrupted_batch_raises_the_users_error_and_leaves_state_whole(record_property, mode, phase):
    watch = FiniteWatch()
    trainer, _ = hybrid_trainer(60, hybrid=hybrid_callbacks(**MODES[mode]), extra_callbacks=[watch], logger=False)
    model = FaultyModel({(phase, 3): "corrupt"})
    with pytest.raises(RuntimeError, match="dtype") as err:
        trainer.fit(model, loader())
    scheduler = scheduler_of(trainer)
    assert scheduler.counters.steps_total == watch.steps == trainer.global_step  # the failed step counted nowhere
    assert torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), watch.last)
    message = str(err.value).splitlines()[0]
    record(
        record_property, "corrupted batch (wrong dtype)", f"{phase.label} step", f"the model's error: {message}", mode
    )


def _checkpoint(tmp_path, mode: str):
    """A checkpoint taken mid-run (step 20), and a Trainer that resumes from it."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=20, save_top_k=-1, filename="{step}")
    hybrid = hybrid_callbacks(**MODES[mode])
    trainer, _ = hybrid_trainer(20, hybrid=hybrid, extra_callbacks=[ckpt], logger=False, enable_checkpointing=True)
    trainer.fit(FaultyModel(), loader())
    return tmp_path / "step=20.ckpt"


def _resume(path, mode: str):
    trainer, _ = hybrid_trainer(30, hybrid=hybrid_callbacks(**MODES[mode]), logger=False)
    trainer.fit(FaultyModel(), loader(), ckpt_path=path)


def _edit_scheduler_state(path, edit):
    checkpoint = torch.load(path, weights_only=False)
    key = next(k for k in checkpoint["callbacks"] if "HybridScheduler" in k)
    edit(checkpoint["callbacks"][key])
    torch.save(checkpoint, path)


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("damage", ["version from the future", "missing key", "truncated file"])
def test_damaged_checkpoint_fails_with_a_clear_error(record_property, tmp_path, damage, mode):
    path = _checkpoint(tmp_path, mode)
    if damage == "version from the future":
        _edit_scheduler_state(path, lambda state: state.update(version=99))
        expected = "HybridScheduler: the checkpoint's state has version 99"
    elif damage == "missing key":
        _edit_scheduler_state(path, lambda state: state.pop("record"))
        expected = r"HybridScheduler: the checkpoint's state lacks \['record'\]"
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        expected = "Cannot read the checkpoint .* truncated, damaged or not a checkpoint"
    with pytest.raises((ValueError, RuntimeError), match=expected) as err:
        _resume(path, mode)
    message = str(err.value).split(";")[0].replace(str(tmp_path), "<dir>")  # no machine paths in the report
    record(record_property, f"checkpoint: {damage}", "resume", "refused: " + message, mode)


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """Every run of ``tests/faults/kill_worker.py`` that SIGKILLs itself, forked from one process: the folder of
    each one's checkpoints, and each one's exit code."""
    from tests.helpers import run_script

    root = tmp_path_factory.mktemp("killed")
    run_script("tests.faults.kill_worker", root)
    return root, json.loads((root / "exit_codes.json").read_text())


@pytest.mark.slow
@pytest.mark.xdist_group("killed")  # one launch of the runs that kill themselves
def test_sigkill_mid_predict_then_resume_matches_the_uninterrupted_run(record_property, tmp_path, killed):
    root, codes = killed
    assert codes["per-step"] == -signal.SIGKILL, (root / "per-step.log").read_text()[-3000:]
    reference = flat_params(run(tmp_path / "uninterrupted"))
    last = by_step(root / "per-step")[-1]
    assert step_of(last) > KILL_AFTER - 2  # it died after this checkpoint, inside a segment
    resumed = flat_params(run(tmp_path / "resumed", ckpt_path=last))
    assert torch.equal(resumed, reference)
    outcome = f"resumed from {last.name}; final weights bitwise equal to the uninterrupted run"
    record(record_property, "process SIGKILLed mid-Predict", "predicted step", outcome)


@pytest.fixture(scope="module")
def cycle_run(tmp_path_factory):
    """The uninterrupted run, with a checkpoint at every epoch's end, and the first checkpoint at each point."""
    root = tmp_path_factory.mktemp("cycle")
    params, summary = cycle_run_of(root / "ckpt")
    return params, summary, first_at_each_point(by_step(root / "ckpt"))


@pytest.mark.xdist_group("killed")
@pytest.mark.parametrize("point", list(POINTS))
def test_the_default_sigkilled_at_any_point_of_its_cycle_resumes_from_its_last_checkpoint_bitwise(
    record_property, tmp_path, cycle_run, killed, point
):
    """A run SIGKILLed, with no clean-up at all, the step after its first checkpoint at each point of the default's
    cycle: that checkpoint is its last, and resumed from it the run ends bitwise as the uninterrupted one, with the
    same jumps made, kept and undone."""
    params, summary, found = cycle_run
    root, codes = killed
    assert point in found, f"no checkpoint {point} in {CYCLE_STEPS} steps"
    assert codes[point] == -signal.SIGKILL, (root / f"{point}.log").read_text()[-3000:]
    last = by_step(root / point)[-1]
    assert last.name == found[point].name  # killed right after the point, as the uninterrupted run passed it
    resumed, resumed_summary = cycle_run_of(tmp_path, ckpt_path=last)
    assert torch.equal(resumed, params)
    counts = ("jumps_made", "jumps_kept", "jumps_undone", "backward_passes", "steps_by_phase")
    assert [resumed_summary[k] for k in counts] == [summary[k] for k in counts]
    assert summary["jumps_undone"] >= 1 and summary["jumps_kept"] >= 1
    outcome = (
        f"SIGKILLed at step {step_of(last) + 1}; resumed from {last.name}; final weights bitwise equal to the "
        "uninterrupted run"
    )
    record(record_property, "process SIGKILLed", point, outcome, "default")


@pytest.mark.xdist_group("killed")
def test_the_default_sigkilled_writing_a_checkpoint_refuses_it_by_name_and_resumes_from_the_one_before(
    record_property, tmp_path, cycle_run, killed
):
    """A run SIGKILLed half-way through writing its checkpoint between a jump and its verdict: that file, cut
    short, is refused by name; the one before it resumes the run, which ends bitwise as the uninterrupted one."""
    params, summary, found = cycle_run
    root, codes = killed
    assert codes["writing"] == -signal.SIGKILL, (root / "writing.log").read_text()[-3000:]
    *_, before, cut = by_step(root / "writing")
    assert cut.name == found[WRITING].name and cut.stat().st_size < before.stat().st_size
    with pytest.raises(RuntimeError, match=r"Cannot read the checkpoint .*: it is truncated, damaged or not a"):
        cycle_run_of(tmp_path / "cut", ckpt_path=cut)
    resumed, resumed_summary = cycle_run_of(tmp_path / "before", ckpt_path=before)
    assert torch.equal(resumed, params) and resumed_summary["jumps_made"] == summary["jumps_made"]
    outcome = f"{cut.name}, cut short, refused by name; resumed from {before.name}, bitwise the uninterrupted run"
    record(record_property, "process SIGKILLed writing a checkpoint", WRITING, outcome, "default")


def test_an_error_inside_a_jump_reaches_the_user_and_the_run_resumes_bitwise(record_property, tmp_path, cycle_run):
    """Out of memory part-way through the first jump (allocating the weights it lands on), inside ``Trainer.fit``:
    the error reaches the user as Lightning raises it; the checkpoint Lightning's ``OnExceptionCheckpoint`` writes
    then holds the run as it was before the jump, and resumed from it, as from the last checkpoint before it, the
    run ends bitwise as the uninterrupted one."""
    from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

    from lightning_hybrid.predictors import outer

    params, summary, found = cycle_run
    planned, failed = outer.plan, []

    def plan(*args, **kwargs):  # the first jump's fourth operation: allocating the weights it lands on
        if failed:
            return planned(*args, **kwargs)
        failed.append(True)
        with FailAt(3, []):
            return planned(*args, **kwargs)

    root = tmp_path / "failed"
    saving = [ModelCheckpoint(root / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}")]
    saving.append(OnExceptionCheckpoint(root, filename="on_exception"))
    trainer, _ = hybrid_trainer(CYCLE_STEPS, hybrid=hybrid_callbacks(**DEFAULT_SHORT), extra_callbacks=saving,
                                logger=False, enable_checkpointing=True, default_root_dir=root)  # fmt: skip
    outer.plan = plan
    try:
        with pytest.raises(RuntimeError, match=r"injected into _foreach_add\.List"):
            trainer.fit(RegressionModel(scheduler=True), loader(64, batch_size=32))
    finally:
        outer.plan = planned
    assert failed and trainer.state.status == "interrupted"
    resumed, resumed_summary = cycle_run_of(tmp_path / "resumed", ckpt_path=root / "on_exception.ckpt")
    assert torch.equal(resumed, params) and resumed_summary["jumps_made"] == summary["jumps_made"]
    # the last checkpoint before the error is the uninterrupted run's own, whose resume the row "just before a
    # jump" runs: the same weights and plugin state
    last = by_step(root / "ckpt")[-1]
    assert last.name == found["just before a jump"].name
    states = [torch.load(path, weights_only=False) for path in (last, found["just before a jump"])]
    plugin = [{k: v for k, v in state["callbacks"].items() if "Checkpoint" not in k} for state in states]
    for state in plugin:  # the seconds each run took aside
        run_record = state["HybridScheduler"]["record"]
        run_record["wall_time_s"], run_record["counters"]["time_by_phase_s"] = None, None
    assert not differences(states[0]["state_dict"], states[1]["state_dict"], exact_floats=True)
    assert not differences(*plugin, exact_floats=True)
    outcome = ("raised to the user; resumed from OnExceptionCheckpoint's file, bitwise; the last checkpoint before it "
               "holds the uninterrupted run's state")  # fmt: skip
    record(record_property, "error raised inside a jump (out of memory)", "Trainer.fit", outcome, "default")


@pytest.mark.xdist_group("killed_rank")  # started early (tests/conftest.py): its ranks take long to launch
def test_a_rank_killed_mid_cycle_under_hybrid_ddp_ends_the_other_and_both_resume_bitwise(record_property, tmp_path):
    """Two ranks under ``hybrid_ddp``; rank 1 SIGKILLed between a jump and its verdict. Rank 0 does not hang: it
    ends with an error by Lightning's own timeout at the latest. Both ranks resumed from the last checkpoint end
    bitwise as the uninterrupted run."""
    from tests.faults.killed_rank import EVERY
    from tests.forked_ranks import tail
    from tests.helpers import run_script

    run_script("tests.faults.killed_rank", tmp_path)
    codes = json.loads((tmp_path / "exit_codes.json").read_text())
    killed_at = int((tmp_path / "killed_at").read_text())
    assert codes["killed"][1] == -signal.SIGKILL and codes["killed"][0] not in (0, None), tail(tmp_path / "killed")
    said = (tmp_path / "killed" / "rank0.log").read_text()
    ended_by = ("Connection closed", "Connection reset", "Timed out", "timed out")
    assert any(word in said for word in ended_by), said[-3000:]  # a collective's error, not a hang
    assert codes["resumed"] == [0, 0], tail(tmp_path / "resumed")
    load = {f: [torch.load(tmp_path / f"{f}-rank{r}.pt") for r in (0, 1)] for f in ("full", "resumed")}
    assert all(torch.equal(run["params"], load["full"][0]["params"]) for run in load["full"] + load["resumed"])
    counts = ("jumps_made", "jumps_kept", "jumps_undone", "backward_passes")
    assert [load["resumed"][0]["summary"][k] for k in counts] == [load["full"][0]["summary"][k] for k in counts]
    last = killed_at // EVERY * EVERY
    outcome = (f"rank 1 killed at step {killed_at}; rank 0 ended with an error; both resumed from step {last}, "
               "bitwise the uninterrupted run")  # fmt: skip
    record(record_property, "one of 2 ranks SIGKILLed (hybrid_ddp)", "between a jump and its verdict", outcome,
           "default")  # fmt: skip
