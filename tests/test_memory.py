"""Memory: the VRAMLogger, predict-aware offload, per-phase precision, and no growth over long runs."""

import json
import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from benchmarks.long_run import MemorySampler
from benchmarks.long_run import main as long_run
from lightning_hybrid import (
    DivergenceMonitor,
    DynamicsPredictor,
    HybridConfig,
    HybridScheduler,
    Phase,
    ResidualCorrector,
    VRAMLogger,
    hybrid_callbacks,
)
from lightning_hybrid.callbacks.memory import proc_status
from lightning_hybrid.offload import OptimizerStateOffload
from tests.helpers import (
    FAST_PHASES,
    RegressionModel,
    SometimesExploding,
    flat_params,
    hybrid_trainer,
    loader,
    phases,
    scheduler_of,
)

# ------------------------------------------------------------------------------------------------- VRAMLogger


def test_vram_logger_logs_every_step_and_per_phase_peaks(tmp_path):
    trainer, logger = hybrid_trainer(40, extra_callbacks=[VRAMLogger()], default_root_dir=tmp_path)
    trainer.fit(RegressionModel(), loader())
    rss, peak = logger.series("memory/rss_mib"), logger.series("memory/peak_rss_mib")
    assert sorted(rss) == list(range(1, 41))
    assert all(0 < rss[s] <= peak[s] for s in rss)
    peaks = scheduler_of(trainer).summary(trainer)["memory_peak_bytes_by_phase"]
    assert set(peaks) == {phase.label for phase in Phase} and all(v > 0 for v in peaks.values())


def test_vram_logger_logs_at_phase_transitions_between_its_intervals(tmp_path):
    trainer, logger = hybrid_trainer(40, extra_callbacks=[VRAMLogger(every_n_steps=10)], default_root_dir=tmp_path)
    trainer.fit(RegressionModel(), loader())
    logged = set(logger.series("memory/rss_mib"))
    by_step = phases(logger)
    transitions = {s for s in by_step if s > 1 and by_step[s] is not by_step[s - 1]}
    assert transitions and transitions <= logged
    assert {10, 20, 30, 40} <= logged and len(logged) < 40


def test_emergency_checkpoint_is_saved_once_and_warned(tmp_path):
    memory = VRAMLogger(emergency_threshold=1)  # one byte: crossed at the first step
    trainer, _ = hybrid_trainer(12, extra_callbacks=[memory], default_root_dir=tmp_path)
    saves = []
    save = trainer.save_checkpoint
    trainer.save_checkpoint = lambda path, *a, **k: (saves.append(path), save(path, *a, **k))
    with pytest.warns(UserWarning, match="emergency threshold"):
        trainer.fit(RegressionModel(), loader())
    assert saves == [tmp_path / "emergency.ckpt"]
    checkpoint = torch.load(tmp_path / "emergency.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 1
    state = next(v for k, v in checkpoint["callbacks"].items() if "VRAMLogger" in k)
    assert state["emergency_saved"] is True  # a run resumed from it does not save another


def test_emergency_threshold_as_a_fraction_of_memory(tmp_path):
    memory = VRAMLogger(emergency_threshold=1.0)  # all of the machine's RAM: never reached
    trainer, _ = hybrid_trainer(5, extra_callbacks=[memory], default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*emergency.*")
        trainer.fit(RegressionModel(), loader())
    assert not memory.emergency_saved and not (tmp_path / "emergency.ckpt").exists()


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"emergency_threshold": 0}, "emergency_threshold"),
        ({"emergency_threshold": 1.5}, "emergency_threshold"),
        ({"emergency_threshold": True}, "emergency_threshold"),
        ({"emergency_threshold": "1GB"}, "emergency_threshold"),
        ({"emergency_filename": "dir/x.ckpt"}, "emergency_filename"),
    ],
)
def test_vram_logger_rejects_bad_settings(kwargs, setting):
    with pytest.raises(ValueError, match=f"VRAMLogger: `{setting}` must be"):
        VRAMLogger(**kwargs)


@pytest.mark.parametrize("setting, value", [("predict_memory", "cpu"), ("predict_precision", "fp16")])
def test_memory_settings_are_checked(setting, value):
    with pytest.raises(ValueError, match=f"`{setting}` must be one of"):
        HybridConfig(**{setting: value})


# ----------------------------------------------------------------------------------------- predict_memory


def test_offload_round_trip_restores_optimizer_state_bitwise():
    model = RegressionModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    before = {p: {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    originals = {p: dict(s) for p, s in opt.state.items()}
    offload = OptimizerStateOffload(opt)
    offload.offload()
    for p, state in opt.state.items():
        for key, value in state.items():
            assert value is not originals[p][key]  # the device tensors are no longer held
            assert torch.equal(value, before[p][key])
    offload.restore()
    offload.wait()
    host = {id(t) for t in offload._host.values()}
    for p, state in opt.state.items():
        for key, value in state.items():
            assert torch.equal(value, before[p][key]) and value.dtype == before[p][key].dtype
            assert id(value) not in host  # a fresh tensor: the next offload may reuse the host buffers


class PredictMemoryProbe(L.Callback):
    """During Predict: gradients are freed and the optimizer state is the offloaded host copy."""

    def __init__(self) -> None:
        self.predicted_steps = 0

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        scheduler = scheduler_of(trainer)
        if scheduler.phase is not Phase.PREDICT or scheduler.engine.machine.segment_pos == 0:
            return
        self.predicted_steps += 1
        assert all(p.grad is None for p in pl_module.parameters())
        store = scheduler.engine.store
        host = set(map(id, store.offload._host.values()))
        state = trainer.optimizers[0].state
        assert host and all(id(v) in host for s in state.values() for v in s.values())
        if scheduler.config.predict_memory == "aggressive":
            assert store.buffer == [] and store.snapshot_on_host


def _train(memory: str, probe: L.Callback | None = None):
    trainer, _ = hybrid_trainer(
        60, settings={"predict_memory": memory}, extra_callbacks=[probe] if probe else [], logger=False
    )
    model = RegressionModel()
    trainer.fit(model, loader())
    return model, trainer


@pytest.mark.parametrize("memory", ["offload", "aggressive"])
def test_predict_memory_frees_memory_during_predict_and_changes_nothing(memory):
    reference, ref_trainer = _train("none")
    probe = PredictMemoryProbe()
    model, trainer = _train(memory, probe)
    assert probe.predicted_steps > 0
    untimed = {"time_by_phase_s": None}
    assert scheduler_of(trainer).counters.to_dict() | untimed == scheduler_of(ref_trainer).counters.to_dict() | untimed
    assert torch.equal(flat_params(model), flat_params(reference))
    ref_state, state = ref_trainer.optimizers[0].state_dict(), trainer.optimizers[0].state_dict()
    for i, s in state["state"].items():
        for key, value in s.items():
            assert torch.equal(value, ref_state["state"][i][key]), (i, key)


# ----------------------------------------------------------------------------------------- capture_buffer


class BufferProbe(L.Callback):
    """After every step (after the scheduler's own hook): whether the store holds its parameter-sized buffer, and
    whether a segment's snapshot is what it holds."""

    def __init__(self) -> None:
        self.held: list[tuple[bool, bool]] = []  # (buffer held, snapshot alive)
        self.kept: set[bool] = set()  # the store's keep_buffer, as seen during fit

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        store = scheduler_of(trainer).engine.store
        self.held.append((bool(store.buffer), store.snapshot_alive))
        self.kept.add(store.keep_buffer)


def _capture_run(capture_buffer: str, optimizer: str, memory: str = "none"):
    probe = BufferProbe()
    settings = {"capture_buffer": capture_buffer, "predict_memory": memory}
    trainer, _ = hybrid_trainer(60, settings=settings, extra_callbacks=[probe], logger=False)
    model = RegressionModel(optimizer=optimizer)
    trainer.fit(model, loader())
    return model, scheduler_of(trainer), probe


@pytest.mark.parametrize("optimizer, memory", [("adam", "none"), ("fused_adam", "none"), ("adam", "aggressive")])
def test_a_per_step_capture_buffer_is_held_only_while_in_use_and_changes_nothing(optimizer, memory):
    reference, ref_scheduler, kept = _capture_run("kept", optimizer, memory)
    model, scheduler, per_step = _capture_run("per_step", optimizer, memory)
    assert torch.equal(flat_params(model), flat_params(reference))  # bitwise: the same update, captured either way
    untimed = {"time_by_phase_s": None}
    assert scheduler.counters.to_dict() | untimed == ref_scheduler.counters.to_dict() | untimed
    assert scheduler.counters.steps_by_phase["predict"] > 0
    assert per_step.kept == {False} and kept.kept == {True}
    # between steps the per-step buffer exists only as a segment's snapshot (on the host under "aggressive")
    snapshot_on_device = memory != "aggressive"
    assert all(held == (alive and snapshot_on_device) for held, alive in per_step.held)
    assert any(alive for _, alive in per_step.held) and any(not alive for _, alive in per_step.held)
    assert all(held or (alive and not snapshot_on_device) for held, alive in kept.held)


def test_the_default_capture_buffer_is_per_step_and_outer_always_keeps_it():
    assert _capture_run(HybridConfig().capture_buffer, "adam")[2].kept == {False}
    probe = BufferProbe()
    outer = hybrid_callbacks("outer", capture_buffer="per_step", warmup_steps=5, full_steps=10)
    trainer, _ = hybrid_trainer(30, hybrid=outer, extra_callbacks=[probe], logger=False)
    trainer.fit(RegressionModel(), loader())
    assert probe.kept == {True} and all(held for held, _ in probe.held)  # the anchor of outer's cycles lives in it


def test_capture_buffer_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match=r"capture_buffer.*'kept', 'per_step'"):
        HybridConfig(capture_buffer="never")


# ---------------------------------------------------------------------------------------- predict_precision


class AutocastRecorder(RegressionModel):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[bool, bool, torch.dtype]] = []  # (grad enabled, autocast on, autocast dtype)

    def training_step(self, batch, batch_idx):
        self.calls.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return super().training_step(batch, batch_idx)


def test_bf16_predict_precision_autocasts_predicted_forwards_only():
    trainer, _ = hybrid_trainer(40, settings={"predict_precision": "bf16"}, logger=False)
    model = AutocastRecorder()
    trainer.fit(model, loader())
    predicted = [c for c in model.calls if not c[0]]
    ordinary = [c for c in model.calls if c[0]]
    assert predicted and all(on and dtype == torch.bfloat16 for _, on, dtype in predicted)
    assert ordinary and not any(on for _, on, _ in ordinary)
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("predict_precision", ["32", "bf16"])
def test_bf16_mixed_trainer_runs_every_forward_in_bf16_and_keeps_float32_weights(predict_precision):
    trainer, _ = hybrid_trainer(
        40, settings={"predict_precision": predict_precision}, precision="bf16-mixed", logger=False
    )
    model = AutocastRecorder()
    trainer.fit(model, loader())
    assert scheduler_of(trainer).counters.steps_by_phase["predict"] > 0
    assert any(not grad for grad, _, _ in model.calls)
    assert all(on and dtype == torch.bfloat16 for _, on, dtype in model.calls)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())


class SpyScaler(torch.amp.GradScaler):
    """A real GradScaler that records the phase of each step it takes part in."""

    def __init__(self) -> None:
        super().__init__("cpu", init_scale=2.0**8, growth_interval=10_000)
        self.trainer = None
        self.events: list[tuple[str, Phase]] = []

    def _phase(self) -> Phase:
        return scheduler_of(self.trainer).phase

    def step(self, optimizer, *args, **kwargs):
        self.events.append(("step", self._phase()))
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.events.append(("update", self._phase()))
        return super().update(new_scale)


def test_grad_scaler_is_stepped_on_ordinary_steps_only_and_is_not_touched_by_predict():
    scaler = SpyScaler()
    trainer, _ = hybrid_trainer(
        40, settings={"predict_precision": "bf16"}, plugins=[MixedPrecision("16-mixed", "cpu", scaler)]
    )
    scaler.trainer = trainer
    trainer.fit(RegressionModel(), loader())
    counters = scheduler_of(trainer).counters
    assert counters.steps_by_phase["predict"] > 0
    assert all(phase.ordinary for _, phase in scaler.events)  # phase is read before the step ends
    assert sum(kind == "update" for kind, _ in scaler.events) == counters.backward_passes
    # the growth tracker counts the finite steps the scaler has seen: the ordinary ones, and only those
    assert scaler._get_growth_tracker() == counters.backward_passes and scaler.get_scale() == 2.0**8


# ---------------------------------------------------------------------------------------------- long runs


@pytest.mark.slow
@pytest.mark.skipif(proc_status("VmRSS") is None, reason="reads RSS from /proc (Linux)")
def test_fifteen_hundred_hybrid_steps_do_not_grow_memory():
    """1,500 steps: about 390 of them predicted and 55 rollbacks, where more than 300 and 20 are asked for (1,200
    steps give 308, too near), and four samples (every 250 steps) after the settling by step 500. A leak of a tensor a
    step (one parameter copy kept, say) changes the live tensors between any two samples, so it fails here as at 3,000
    steps (checked with one injected). Memory in use catches a leak that makes no tensor only once it passes 5% of the
    RSS, about 24 MB: 32 KB a step over the 750 steps from the first sample to the last (11 KB at 3,000 steps; a 40 KB
    leak injected fails here)."""
    probe = MemorySampler()
    # aggressive: the most allocation of all modes (the update buffer comes and goes); plans that blow up in
    # alternate blocks, so rollbacks happen all along the run
    scheduler = HybridScheduler(**FAST_PHASES, predict_memory="aggressive")
    hybrid = [scheduler, DynamicsPredictor(SometimesExploding()), ResidualCorrector(), DivergenceMonitor()]
    trainer, _ = hybrid_trainer(1500, hybrid=hybrid, extra_callbacks=[probe], logger=False)
    trainer.fit(RegressionModel(), loader(1024))
    counters = scheduler_of(trainer).counters
    assert counters.steps_by_phase["predict"] > 300 and counters.rollbacks > 20  # every path ran, many times
    after_warmup = {s: v for s, v in probe.samples.items() if s >= 500}
    rss = [v[0] for v in after_warmup.values()]
    tensors = [v[1] for v in after_warmup.values()]
    assert max(rss) < 1.05 * rss[0], rss
    assert len(set(tensors)) == 1, tensors
    assert len({tuple(v[2]) for v in probe.samples.values()}) == 1  # parameters updated in place, never replaced


@pytest.mark.slow
def test_long_run_benchmark_records_flat_memory(tmp_path):
    """The driver end to end on a char GPT of a few thousand parameters: 60 steps, predicting from step 30, sampled
    every 20 (its figures mean nothing here)."""
    tiny = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "data.batch_size=4", "data.max_bytes=20000"]
    result = long_run(["--steps", "60", "--sample-every", "20", "--out", str(tmp_path), *tiny])
    assert json.loads((tmp_path / "long_run_char_gpt.json").read_text()) == json.loads(json.dumps(result))
    assert result["samples"] and result["parameter_addresses_constant"]
    assert result["counters"]["steps_by_phase"]["predict"] > 0
