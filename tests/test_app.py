"""The Hydra training app end to end: compose API, console script, overrides, sweeps, compare mode."""

import json
import logging
import re
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_hybrid import DivergenceMonitor, DynamicsPredictor, HorizonBandit, HybridScheduler, hybrid_callbacks
from lightning_hybrid.hydra_settings import PREDICTOR_SETTINGS, HybridSettings, setting_names
from lightning_hybrid.predictors import PREDICTORS, OuterMomentum
from lightning_hybrid.runner import _build, run
from lightning_hybrid.train import CONFIG_MODULE
from tests.helpers import APP_PHASES, APP_SMALL_GPT, APP_STEPS, APP_TRAINER, ROOT, app_config, console


def scalars(log_dir: Path, tag: str) -> list[int]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_train_end_to_end_through_the_compose_api(tmp_path):
    val = run(app_config(tmp_path))
    assert val is not None and 0 < val < 10
    log_dir = tmp_path / "tensorboard" / "hybrid"
    assert scalars(log_dir, "hybrid/phase") == list(range(APP_STEPS))  # Lightning's steps: batches before
    summary = json.loads((log_dir / "hybrid_summary.json").read_text())
    assert summary["steps_total"] == APP_STEPS and summary["backward_skipped"] > 0


def test_compare_runs_plain_and_hybrid_with_the_same_seed(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        run(app_config(tmp_path, "mode=compare"))
    result = json.loads((tmp_path / "compare.json").read_text())
    plain, hybrid = result["plain"], result["hybrid"]
    summary = json.loads((tmp_path / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())
    assert plain["steps"] == hybrid["steps"] == APP_STEPS
    assert plain["backward_passes"] == APP_STEPS  # counted by the same RunMeter in both runs
    assert hybrid["backward_passes"] == APP_STEPS - summary["backward_skipped"] < APP_STEPS
    table = caplog.text
    led = ["first at plain's final loss: step", "its training time, wall (seconds)", "its training time, CPU (seconds)"]
    led += ["val loss at equal steps (step 12)", "whole fit: steps", "training time, wall (seconds)"]
    led += ["training time, CPU (seconds)", "validation, wall (seconds)", "backward passes"]
    labels = [line[:38].strip() for line in table.splitlines()]
    assert [label for label in labels if label in led] == led  # the table's rows, in its order
    assert "to plain's final val loss" in table
    fits = [table.index(f"fit {i} of 2, {label}: training with") for i, label in ((1, "plain"), (2, "hybrid"))]
    assert fits == sorted(fits)  # each fit named as it starts, before the table
    step, wall, cpu = plain["reached_plain_at"]  # plain reaches its own final loss, by the end at the latest
    assert 0 < step <= APP_STEPS and 0 < wall <= plain["train_seconds"] and 0 < cpu <= plain["train_cpu_seconds"]
    reached = hybrid["reached_plain_at"]
    assert (reached is None and "never" in table) or 0 < reached[0] <= APP_STEPS
    assert not (tmp_path / "tensorboard" / "plain" / "hybrid_summary.json").exists()
    steps = [v[0] for v in plain["validations"]]
    assert steps and steps == [v[0] for v in hybrid["validations"]]  # inside fit, every trainer.val_check_interval
    assert (
        f"validated every 6 steps, 2 times inside each fit on 1 batch, at steps {', '.join(map(str, steps))}: " in table
    )
    assert hybrid["mode"] == "per-step" and set(hybrid["counts"]) == {
        "backward_skipped_pct",
        "segments_started",
        "rollbacks",
    }


def test_the_quick_start_job_jumps_and_compare_reports_the_jumps(tmp_path, caplog):
    """The Quick start's main job (mode=compare, the default rule) shows prediction happening next to plain."""
    base = [o for o in APP_TRAINER if not o.startswith("predictor")]
    base += ["hybrid.full_steps=3", "predictor.verify_window=2"]
    base += ["predictor.restart=false"]  # 3 jumps: none left out by a turning cycle
    base += ["model.warmup_steps=0"]  # no rate warm-up: the default makes no jump while the rate rises
    with caplog.at_level(logging.INFO):
        run(app_config(tmp_path, "mode=compare", base=base + APP_SMALL_GPT))
    result = json.loads((tmp_path / "compare.json").read_text())
    jumps = (APP_STEPS - 3) // 3 - 1  # not at the last step: no step would be left to verify it
    assert result["hybrid"]["counts"]["jumps_made"] == jumps and result["plain"]["counts"] == {}
    assert result["hybrid"]["mode"] == "jumps" and result["plain"]["mode"] is None
    assert result["hybrid"]["backward_passes"] == result["plain"]["backward_passes"] == APP_STEPS
    assert result["hybrid"]["val_loss"] != result["plain"]["val_loss"]
    counts = result["hybrid"]["counts"]
    for name in ("jumps_made", "jumps_kept", "jumps_undone"):  # a count a row, within 80 columns
        assert re.search(rf"\n{name.replace('_', ' ')} +- +{counts[name]}\n", caplog.text), name
    assert counts["jumps_made"] == jumps and "segment" not in caplog.text
    (said,) = [r.getMessage() for r in caplog.records if "hybrid against plain" in r.getMessage()]
    table = said[said.index("hybrid against plain") - 60 :].split("\n(one seed")[0]
    assert max(len(line) for line in table.splitlines()) <= 80
    assert (tmp_path / "compare.png").stat().st_size > 10_000  # both curves, against steps and seconds


# what the learning-rate harness measured as `outer_norm_restart_res` (docs/performance.md): the defaults must be it
MEASURED_RULE = {"outer_lr": 0.7, "outer_momentum": 0.5, "alignment_window": 0, "keep_norms": True, "restart": True}
MEASURED_RULE |= {"verify_window": None, "verify_sigmas": 2.0, "verify_resolution": 0.2}  # the window: half the cycle
MEASURED_PHASES = {"warmup_steps": 100, "full_steps": 20}
MEASURED_MONITOR = {"z_threshold": 4.0}


def _measured(callbacks: list) -> None:
    rule = next(cb for cb in callbacks if isinstance(cb, DynamicsPredictor)).predictor
    assert isinstance(rule, OuterMomentum) and rule.state_on_host is None  # on the device unless it would crowd CUDA
    assert {k: getattr(rule, k) for k in MEASURED_RULE} == MEASURED_RULE
    config = next(cb for cb in callbacks if isinstance(cb, HybridScheduler)).config
    assert {k: getattr(config, k) for k in MEASURED_PHASES} == MEASURED_PHASES
    monitor = next(cb for cb in callbacks if isinstance(cb, DivergenceMonitor)).divergence
    assert {k: getattr(monitor, k) for k in MEASURED_MONITOR} == MEASURED_MONITOR
    assert not any(isinstance(cb, HorizonBandit) for cb in callbacks)  # jumps choose no horizons


def test_the_defaults_are_the_measured_rule_in_python_and_in_the_app_and_overrides_turn_the_guards_off(tmp_path):
    """`hybrid_callbacks()` and the app with no `predictor=` build `outer` with the guards the harness measured;
    unguarded `outer` is the guards set off."""
    default = app_config(tmp_path, base=[])
    assert default == app_config(tmp_path, "predictor=outer", base=[])
    _measured(hybrid_callbacks())
    _measured(_build(default.hybrid, predictor=default.predictor))
    plain_outer = app_config(
        tmp_path, "predictor.keep_norms=false", "predictor.restart=false", "predictor.verify_resolution=0", base=[]
    )
    rule = _build(plain_outer.predictor)
    assert not rule.keep_norms and not rule.restart and plain_outer.predictor.verify_resolution == 0


def test_compare_without_prediction_gives_identical_runs(tmp_path):
    run(app_config(tmp_path, "mode=compare", "hybrid.enable_prediction=false"))
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["plain"]["val_loss"] == result["hybrid"]["val_loss"]  # same seed, same batches, bit for bit


@pytest.mark.parametrize("full_steps", [2, 5])
def test_a_cycle_length_set_alone_trains_and_jumps_in_the_app(tmp_path, full_steps):
    """The default rule with only the cycle changed (the window follows it), a short warmup and the verdict's
    noise limit off so that this tiny GPT jumps."""
    base = [o for o in APP_TRAINER if not o.startswith("predictor")] + APP_SMALL_GPT
    overrides = [f"hybrid.full_steps={full_steps}", "predictor.verify_resolution=0", "trainer.max_steps=30"]
    overrides += ["model.warmup_steps=0"]  # no rate warm-up: the default makes no jump while the rate rises
    run(app_config(tmp_path, *overrides, base=base))
    summary = json.loads((tmp_path / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())
    assert summary["jumps_made"] >= 1 and summary["settings"]["verify_window"] == max(1, full_steps // 2)


def test_the_apps_defaults_warn_about_no_setting_the_user_did_not_set(tmp_path):
    """The Quick start's config passes every hybrid setting at its default: none is the user's, none is warned
    about (a per-step setting the user does set still is)."""
    from lightning_hybrid.runner import build_run

    def said(*overrides: str) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build_run(app_config(tmp_path, "mode=compare", *overrides, base=APP_SMALL_GPT), hybrid=True)
        return [str(w.message) for w in caught if "hybrid:" in str(w.message)]

    assert said() == []
    told = said("hybrid.max_predict_steps=7")
    assert len(told) == 1 and "`max_predict_steps` belongs to the per-step mode" in told[0]


def test_plain_mode_uses_no_hybrid_callbacks(tmp_path):
    run(app_config(tmp_path, "mode=plain"))
    assert not list(tmp_path.rglob("hybrid_summary.json"))
    assert (tmp_path / "tensorboard" / "plain").is_dir()


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("hybrid.max_predict_stepz=3", "max_predict_stepz"),
        ("hybrid.max_predict_steps=abc", "hybrid.max_predict_steps"),
        ("predictor.decayy=0.5", "decayy"),
        ("predictor=oracle", "oracle"),
    ],
)
def test_a_wrong_key_or_type_fails_at_composition_naming_it(tmp_path, override, named):
    with pytest.raises(ConfigCompositionException) as err:
        app_config(tmp_path, override)
    assert named in f"{err.value} {err.value.__cause__}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("hybrid.max_predict_steps=0", r"HybridConfig: `max_predict_steps` must be an integer >= 1, got 0"),
        ("predictor.decay=1.5", r"LinearPredictor: `decay` must be .*got 1.5"),
        ("mode=fast", r"`mode` must be one of 'compare', 'plain', 'train', got 'fast'$"),
        ("mode=comapre", r"`mode` must be one of 'compare', 'plain', 'train', got 'comapre'; did you mean `compare`"),
        ("trainer.strategy=ddp", r"`strategy` must be one of 'hybrid', 'hybrid_ddp', 'hybrid_fsdp', got 'ddp'"),
        ("trainer.strategy=hybrid_dpp", r"got 'hybrid_dpp'; did you mean `hybrid_ddp`"),
    ],
)
def test_an_out_of_range_value_fails_with_the_components_error_before_training(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        run(app_config(tmp_path, override))
    assert not list(tmp_path.rglob("events.out.tfevents*"))  # nothing trained


def test_cli_overrides_reach_the_objects(tmp_path):
    cfg = app_config(tmp_path, "predictor=rssm", "predictor.ensemble=2", "hybrid.max_predict_steps=20")
    callbacks = _build(cfg.hybrid, predictor=cfg.predictor)  # Hydra builds the predictor from its config
    scheduler = next(cb for cb in callbacks if isinstance(cb, HybridScheduler))
    predictor = scheduler.components[0].predictor
    assert scheduler.config.max_predict_steps == 20
    assert type(predictor).__name__ == "RSSMPredictor" and predictor.ensemble == 2
    assert _build(cfg.data).hparams.batch_size == 32


def test_default_hybrid_config_matches_the_python_defaults(tmp_path):
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("train")
    callbacks = _build(cfg.hybrid, predictor=cfg.predictor)
    scheduler = next(cb for cb in callbacks if isinstance(cb, HybridScheduler))
    reference = hybrid_callbacks()
    assert scheduler.config == next(cb for cb in reference if isinstance(cb, HybridScheduler)).config
    assert [type(cb) for cb in callbacks] == [type(cb) for cb in reference]


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_predictor_configs_carry_the_constructor_defaults(tmp_path, name):
    predictor = _build(app_config(tmp_path, f"predictor={name}", base=[]).predictor)
    reference = PREDICTORS[name]()
    assert type(predictor) is type(reference)
    for setting in setting_names(PREDICTOR_SETTINGS[name]):
        assert getattr(predictor, setting) == getattr(reference, setting), setting


TINY_FINETUNE = ["model.pretrain_steps=5", "model.n_layer=1", "model.n_embd=32"]


@pytest.mark.parametrize("experiment", ["char_gpt", "digits_cnn", "word_lstm", "finetune_lora", "finetune_full"])
def test_each_example_runs_as_a_hydra_experiment(tmp_path, experiment, monkeypatch):
    monkeypatch.setenv("LIGHTNING_HYBRID_CACHE", str(tmp_path / "cache"))  # a pretraining of 5 steps, kept here
    overrides = [f"experiment={experiment}", "trainer.max_steps=8", "trainer.limit_val_batches=2"]
    overrides += ["trainer.val_check_interval=4", *TINY_FINETUNE] if experiment.startswith("finetune") else []
    base = APP_TRAINER + APP_PHASES + (APP_SMALL_GPT if experiment == "char_gpt" else [])
    val = run(app_config(tmp_path, *overrides, base=base))
    assert val is not None and val > 0


def test_a_users_own_module_and_data_via_target(tmp_path):
    cfg = app_config(
        tmp_path,
        *APP_PHASES,
        "model=custom",
        "model._target_=tests.app_models.UserRegression",
        "+model.width=4",
        "data=custom",
        "data._target_=tests.app_models.UserData",
        "trainer.val_check_interval=null",
        base=APP_TRAINER,
    )
    assert run(cfg) < 100
    assert scalars(tmp_path / "tensorboard" / "hybrid", "hybrid/phase") == list(range(APP_STEPS))


def test_compare_trains_both_halves_on_the_same_batches_of_a_shuffled_loader(tmp_path):
    """A user's module and a plain ``DataLoader(shuffle=True)`` (its order from the global random state), the
    plugin's warm-up longer than the run: both halves train exactly as plain, so every validation agrees bitwise
    (before, the hybrid half drew its order from the state the plain half had left). Validated every
    `val_check_interval` steps across epochs of 8 batches (before, within each: at 5, 13 and 21)."""
    cfg = app_config(
        tmp_path,
        "mode=compare",
        "model=custom",
        "model._target_=tests.app_models.UserRegression",
        "data=custom",
        "data._target_=tests.app_models.UserData",
        "+data.shuffle=true",
        "trainer.max_steps=24",
        "trainer.val_check_interval=5",
        "hybrid.warmup_steps=100",
        base=[o for o in APP_TRAINER if not o.startswith(("predictor", "hybrid"))],
    )
    run(cfg)
    result = json.loads((tmp_path / "compare.json").read_text())
    plain, hybrid = result["plain"]["validations"], result["hybrid"]["validations"]
    assert [v[0] for v in plain] == [5, 10, 15, 20, 24] and [v for *_, v in plain] == [v for *_, v in hybrid]
    assert len({v for *_, v in plain}) == 5  # it trained: each validation differs from the last


def test_the_progress_bar_switched_off_drops_the_apps_bar_instead_of_failing(tmp_path):
    """``trainer.enable_progress_bar=false`` with the default callbacks (which list the hybrid bar): Lightning
    refuses a bar callback when bars are off, so the app leaves it out."""
    run(app_config(tmp_path, "callbacks=default", "trainer.enable_progress_bar=false"))
    assert (tmp_path / "checkpoints" / "hybrid" / "last.ckpt").is_file()  # the other default callbacks ran


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "hybrid.max_predict_stepz=3",
            "`hybrid.max_predict_stepz` is not a setting; did you mean `hybrid.max_predict_steps`?",
        ),
        ("hybrid.outer_lr=0.5", "`hybrid.outer_lr` is a setting of the predictor group: use predictor.outer_lr=..."),
        ("+hybrid.ful_steps=10", "`hybrid.ful_steps` is not a setting; did you mean `hybrid.full_steps`?"),
        (
            "predictor.warmup_steps=3",
            "`predictor.warmup_steps` is a setting of the hybrid group: use hybrid.warmup_steps",
        ),
        ("hybrid.decay=0.5", "use predictor.decay=... with predictor=linear"),
        ("predictor=mpl", "`predictor=mpl` is no config of the predictor group: one of gpa, linear, mlp, outer, rssm;"),
        ("logger=null", "`logger=null` picks no config: drop the logger group with `~logger`, or pick one of csv,"),
        (
            "trainer.max_step=30",
            "`trainer.max_step` is no argument of Lightning's Trainer; did you mean `trainer.max_steps`",
        ),
        ("+trainer.max_step=30", "`trainer.max_step` is no argument of Lightning's Trainer"),  # Hydra's advice
    ],
)
def test_a_misplaced_or_misspelt_setting_is_refused_before_hydra_composes(tmp_path, override, said):
    said_by_the_app = console(override)
    assert isinstance(said_by_the_app, str) and said in said_by_the_app, said_by_the_app
    assert said_by_the_app.startswith("lightning-hybrid-train: ") and "\n" not in said_by_the_app  # one line
    assert not (tmp_path / "logs").exists()  # refused before any run folder was made


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("predictor.outer_lr=5", "OuterMomentum: `outer_lr` must be a finite number in (0.0, 2.0], got 5.0"),
        (
            "mode=comapre",
            "app: `mode` must be one of 'compare', 'plain', 'train', got 'comapre'; did you mean `compare`?",
        ),
    ],
)
def test_a_value_refused_before_training_is_one_line_and_leaves_no_run_folder(tmp_path, capfd, override, said):
    """Hydra made the run's folder; the app refuses the value (the component's own message, one line, no
    traceback) and removes the folder it left empty, and its parents up to the working directory."""
    assert console(override) == f"lightning-hybrid-train: {said}"
    assert "Traceback" not in capfd.readouterr().err and not (tmp_path / "logs").exists()


def test_the_console_scripts_compare_writes_its_table_and_summary_to_the_runs_log_and_a_plot(tmp_path):
    base = [o for o in APP_TRAINER if not o.startswith(("predictor", "hybrid"))] + APP_SMALL_GPT
    phases = ["hybrid.warmup_steps=3", "hybrid.full_steps=3", "predictor.verify_window=2"]
    assert console(*base, "mode=compare", f"hydra.run.dir={tmp_path}", *phases) == 0
    log = (tmp_path / "train.log").read_text()
    assert "at plain's final loss: step" in log and "validated every 6 steps, 2 times inside each fit" in log
    said = "hybrid (jumps, outer): 12 steps: 3 in the plugin's warm-up (warmup_steps), 9 full"
    assert said in log  # Lightning's messages reach it too
    assert log.count("hybrid (jumps, outer)") == 1
    assert (tmp_path / "compare.png").exists()
    dumped = OmegaConf.load(tmp_path / ".hydra" / "config.yaml").hybrid  # only what the default rule reads
    assert dumped.full_steps == 3 and dumped.warmup_steps == 3 and "z_threshold" in dumped
    assert not {"max_predict_steps", "confidence_threshold", "max_residuals", "bandit"} & set(dumped)


def test_multirun_writes_one_folder_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    base = APP_TRAINER + APP_SMALL_GPT + [p for p in APP_PHASES if "confidence" not in p]
    assert console("--multirun", *base, "hybrid.confidence_threshold=0.0,0.9", f"hydra.sweep.dir={sweep}") == 0
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    skipped = [
        json.loads((sweep / job / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())["backward_skipped"]
        for job in jobs
    ]
    assert skipped[0] > 0 and skipped[1] == 0  # each job got its own threshold
    dumped = OmegaConf.load(sweep / "0" / ".hydra" / "config.yaml").hybrid  # the per-step mode reads these
    assert dumped.confidence_threshold == 0.0 and {"max_predict_steps", "max_residuals", "bandit"} <= set(dumped)


@pytest.mark.slow
def test_optuna_search_tunes_the_hybrid_settings(tmp_path):
    sweep = tmp_path / "optuna"
    # the default rule, its settings free
    base = [o for o in APP_TRAINER if not o.startswith("predictor")] + APP_SMALL_GPT
    assert console(*base, "hparams_search=hybrid_optuna", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep}") == 0
    results = (sweep / "optimization_results.yaml").read_text()
    best = float(re.search(r"best_value: ([0-9.e+-]+)", results).group(1))
    assert 0 < best < 10 and "predictor.outer_lr" in results


def test_the_settings_reference_documents_every_setting():
    readme = (ROOT / "docs" / "settings.md").read_text()
    schemas = [HybridSettings, *PREDICTOR_SETTINGS.values()]
    missing = {f.name for schema in schemas for f in fields(schema) if f"`{f.name}`" not in readme} - {"_target_"}
    assert not missing, f"docs/settings.md lacks {sorted(missing)}"


def test_the_compare_table_leads_with_steps_and_cpu_time_where_the_load_changed():
    """Read as a user reads it: costs in percent of plain's, "more" where the hybrid run needed more, "at least" for
    a gain at the validations' resolution. Where the two runs' CPU seconds per wall second differ (another job took
    cores from one of them), or the load average rose, the line rests on steps and the loss at equal steps, and says
    why the times come after them (the Quick start once led with "1.388x slower in wall time" at 43.13 and 41.88 CPU
    seconds; under load, two threads' CPU time swells as wall time does)."""
    from lightning_hybrid.comparison import RunResult, compared, comparison_table, reached_label

    assert compared(600, 540, "fewer steps", "more steps", "as many steps") == "10% fewer steps"
    assert compared(30.0, 40.0, "less wall time", "more wall time", "as much") == "33% more wall time"
    assert compared(600, 600, "fewer steps", "more steps", "as many steps") == "as many steps"
    validations = [(s, s / 10, s / 5, 3 - s / 600) for s in (100, 200, 300)]

    def result(label, loss, wall, cpu, reached):
        return RunResult(label, loss, wall, cpu, 300, 300, validations=validations, reached_plain_at=reached)

    plain = result("plain", 2.5, 30.0, 43.13, (300, 30.0, 43.13))
    loaded = result("hybrid", 2.6, 41.6, 41.88, (300, 41.6, 41.88))  # 1.388x plain's wall time, at less CPU
    table = " ".join(comparison_table(plain, loaded).split())  # wrapped to 80 columns: words as read
    said = "the hybrid run took as many steps (step 300), and its loss at equal steps was 4.0% higher; its 39% more "
    assert said + "wall time and 3% less CPU time met another load" in table  # steps and losses lead, times after
    assert "CPU seconds per wall second 1.44 in plain, 1.01 in hybrid" in table and "OMP_NUM_THREADS=1" in table
    loaded.train_cpu_seconds, loaded.load, plain.load = 60.0, (0.2, 2.9), (0.1, 0.2)  # busy alike; the load rose
    assert "load (1-minute average) rose from 0.1 to 2.9" in " ".join(comparison_table(plain, loaded).split())
    ahead = result("hybrid", 2.4, 20.0, 29.0, (200, 20.0, 29.0))
    table = " ".join(comparison_table(plain, ahead).split())
    assert "took at least 33% fewer steps (step 200), 33% less wall time and 33% less CPU time" in table
    assert "met another load" not in table and "x " not in table and "times are noisy" in table
    assert [reached_label(540, 0), reached_label(58.5524, 1)] == [
        "hybrid first at plain's final loss: step 540",
        "hybrid first at plain's final loss: 58.6 s",
    ]


@pytest.mark.slow
def test_the_readmes_per_step_command_makes_predict_segments_and_says_why_it_backed_off(tmp_path, caplog):
    """The README's per-step command, as written, on a small char GPT in half the steps (the learning rate's cosine
    over them): Predict segments skip backward passes, and the end of fit gives the steps it backed off by reason."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "# the per-step mode" in line)
    command = line.split("#")[0].split()
    assert command[0] == "lightning-hybrid-train"
    quiet = ["trainer.enable_model_summary=false", "trainer.enable_progress_bar=false", "callbacks=none"]
    cheap = ["trainer.max_steps=300", "trainer.limit_val_batches=2", "trainer.accelerator=cpu", *quiet]
    with caplog.at_level(logging.INFO):
        run(app_config(tmp_path, *command[1:], *cheap, base=APP_SMALL_GPT))
    summary = json.loads((tmp_path / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())
    assert summary["segments_started"] >= 1 and summary["backward_skipped"] >= 1
    gated = summary["backed_off_by"]["learning_rate"]
    assert f"of the steps backed off, {gated} waited for the learning rate" in caplog.text


def test_a_misspelt_group_option_names_the_groups_options_and_yours_in_a_config_dir(tmp_path):
    """A closed choice of the app's groups, checked before Hydra (which would list its structured schemas among
    them): the closest named; an option of the user's own ``--config-dir`` is one."""
    from lightning_hybrid.hydra_settings import misplaced

    said = misplaced(["hybrid=agressive"])
    assert said.endswith("the hybrid group: one of aggressive, conservative, default; did you mean `aggressive`?")
    assert misplaced(["experiment=digits", "trainer.max_steps=5"]).endswith("did you mean `digits_cnn`?")
    assert misplaced(["predictor=mine"]) is not None
    assert misplaced(["trainer.max_step=30"]).endswith("did you mean `trainer.max_steps`?")
    assert misplaced(["trainer._target_=my_pkg.MyTrainer", "trainer.max_step=30"]) is None  # its own arguments
    (tmp_path / "predictor").mkdir()
    (tmp_path / "predictor" / "mine.yaml").write_text("_target_: my_pkg.Mine\n")
    assert misplaced(["--config-dir", str(tmp_path), "predictor=mine"]) is None
    assert misplaced([f"--config-dir={tmp_path}", "predictor=mine", "~logger", "+experiment=char_gpt"]) is None


@pytest.mark.slow
def test_compare_validates_ten_times_a_run_and_under_a_new_load_its_headline_rests_on_steps(tmp_path, caplog):
    """``mode=compare trainer.max_steps=300`` once validated at 100, 200 and 300 only, and headlined "as many
    steps" while the hybrid run ended 2% lower. Every run is validated 10 times (``val_check_interval``: a tenth of
    ``max_steps``); the table states the validations' cost. Under a load that began with the hybrid half (three
    busy loops sharing the hybrid half's core), compare once headlined "46% less CPU time": the headline rests on
    steps and the loss at equal steps, and says why."""
    for steps in (300, 600, 45):
        interval = app_config(tmp_path, f"trainer.max_steps={steps}", base=[]).trainer.val_check_interval
        assert steps // interval >= 10, steps
    quiet = ["trainer.enable_model_summary=false", "trainer.enable_progress_bar=false", "callbacks=none"]
    with caplog.at_level(logging.INFO):
        run(app_config(tmp_path, "mode=compare", "trainer.max_steps=20", "trainer.limit_val_batches=2", *quiet,
                       "trainer.accelerator=cpu", "hybrid.warmup_steps=3", "hybrid.full_steps=3",
                       "predictor.verify_window=2", "predictor.verify_resolution=0", "model.warmup_steps=2",
                       "+callbacks.load._target_=tests.app_models.LoadDuringHybrid", base=APP_SMALL_GPT))  # fmt: skip
    result, text = json.loads((tmp_path / "compare.json").read_text()), " ".join(caplog.text.split())
    assert [v[0] for v in result["plain"]["validations"]] == list(range(2, 21, 2))  # 10 times inside fit
    assert result["plain"]["val_seconds"] > 0 and "validation, wall (seconds)" in text
    assert re.search(r"validated every 2 steps, 10 times inside each fit on 1 batch, .*: \d+% of training", text)
    assert result["hybrid"]["counts"]["jumps_made"] >= 1  # the halves trained differently: the load is what's said
    said = r"the hybrid run took .*\(step \d+\), and its loss at equal steps was .*; its .* met another load \(CPU"
    assert re.search(said, text), text[-2000:]


def test_compare_says_two_runs_that_trained_alike_differ_in_time_by_the_machine_and_counts_what_ran():
    """A hybrid half that made no jump trained as plain did, step for step: its headline says so, and that any
    time difference is the machine's (it once read "1% less wall time and 2% less CPU time"). Otherwise a time
    difference is said with the runs' order. The validations are counted as they ran (one batch here)."""
    from lightning_hybrid.comparison import RunResult, headline, validated_steps

    validations = [(s, s / 10, s / 10, 3 - s / 100) for s in range(10, 101, 10)]
    plain = RunResult("plain", 2.0, 10.0, 10.0, 100, 100, validations=validations, reached_plain_at=(100, 10, 10),
                      val_every=10, val_batches=1, val_count=10)  # fmt: skip
    none = {"jumps_made": 0, "jumps_kept": 0, "jumps_undone": 0}
    hybrid = RunResult("hybrid", 2.0, 9.9, 9.8, 100, 100, mode="jumps", validations=validations, counts=none,
                       reached_plain_at=(100, 9.9, 9.8))  # fmt: skip
    (line,) = headline(plain, hybrid)
    assert line.startswith("the hybrid run made no jump: the two runs trained the same way, so their difference in")
    assert "(1% less wall time and 2% less CPU time, the hybrid run second) is the machine's" in line
    assert "10 times inside each fit on 1 batch, at steps" in validated_steps(plain, hybrid)
    hybrid.counts["jumps_made"] = 2
    assert (
        "1% less wall time and 2% less CPU time (plain ran first, the hybrid run second)" in headline(plain, hybrid)[0]
    )


def test_the_headline_says_when_the_validations_resolution_limits_it():
    from lightning_hybrid.comparison import RunResult, comparison_table

    validations = [(s, s / 10, s / 10, 3 - s / 300) for s in range(30, 301, 30)]
    plain = RunResult("plain", 2.0, 30.0, 30.0, 300, 300, validations=validations, reached_plain_at=(300, 30, 30),
                      val_every=30, val_batches=20)  # fmt: skip
    hybrid = RunResult(
        "hybrid", 1.96, 30.3, 30.3, 300, 300, validations=validations, reached_plain_at=(300, 30.3, 30.3)
    )
    table = " ".join(comparison_table(plain, hybrid).split())
    assert "the hybrid run took as many steps (step 300)" in table
    assert (
        "as many steps to the validations' resolution: validated every 30 steps, a gain under that cannot show" in table
    )
    assert re.search(r"val loss at equal steps \(step 300\) +2\.0000 +1\.9600 +2\.0% lower", table)
    assert "whole fit: steps 300 300 training time, wall (seconds) 30.00 30.30 1% more" in table  # no "as above"
