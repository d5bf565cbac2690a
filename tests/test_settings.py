"""Bad settings fail at construction with the field, the value and what is allowed."""

import warnings
from dataclasses import dataclass

import pytest

from lightning_hybrid import (
    DivergenceMonitor,
    DynamicsPredictor,
    HybridConfig,
    HybridScheduler,
    ResidualCorrector,
    hybrid_callbacks,
)
from lightning_hybrid.predictors import LinearPredictor, OuterMomentum
from lightning_hybrid.settings import Float, setting


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"warmup_steps": -1}, r"`warmup_steps` must be an integer >= 0, got -1"),
        ({"full_steps": 0}, r"`full_steps` must be an integer >= 1, got 0"),
        ({"max_predict_steps": 0}, r"`max_predict_steps` must be an integer >= 1, got 0"),
        ({"confidence_threshold": 1.5}, r"`confidence_threshold` must be a finite number in \[0.0, 1.0\], got 1.5"),
        ({"confidence_threshold": -0.1}, r"`confidence_threshold`.*got -0.1"),
        ({"predict_forward_every": -2}, r"`predict_forward_every` must be an integer >= 0, got -2"),
        ({"correction_steps": 0}, r"`correction_steps` must be an integer >= 1, got 0"),
        ({"warmup_steps": 2.5}, r"`warmup_steps` must be an integer"),
        ({"max_consecutive_rollbacks": 0}, r"`max_consecutive_rollbacks`"),
        ({"predict_lr_fraction": 0.0}, r"`predict_lr_fraction` must be a finite number in \(0.0, 1.0\], got 0.0"),
        ({"predict_lr_fraction": 1.5}, r"`predict_lr_fraction`.*got 1.5"),
    ],
)
def test_phase_settings_are_validated(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        HybridConfig(**kwargs)
    with pytest.raises(ValueError, match=pattern):
        hybrid_callbacks(**kwargs)


def test_max_predict_steps_zero_is_fine_when_prediction_is_off():
    assert HybridConfig(max_predict_steps=0, enable_prediction=False).max_predict_steps == 0


def test_unknown_predictor_name():
    known = "'gpa', 'linear', 'mlp', 'outer', 'rssm'"
    with pytest.raises(ValueError, match=rf"`predictor` must be one of {known}, got 'oracle'"):
        hybrid_callbacks(predictor="oracle")
    with pytest.raises(ValueError, match="'oracle'"):
        DynamicsPredictor("oracle")


def test_unknown_setting_is_named():
    with pytest.raises(TypeError, match="unknown setting `warmup`; did you mean `warmup_steps`"):
        hybrid_callbacks(warmup=3)


@pytest.mark.parametrize("build", [hybrid_callbacks, HybridScheduler], ids=["hybrid_callbacks", "HybridScheduler"])
@pytest.mark.parametrize("typo", ["full_step", "ful_steps", "fullsteps"])
def test_a_misspelt_setting_names_the_closest_first(build, typo):
    with pytest.raises(TypeError) as err:
        build(**{typo: 10})
    assert f"unknown setting `{typo}`; did you mean `full_steps`" in str(err.value)
    assert len(str(err.value)) < 200  # the closest names, not every setting


def test_a_setting_far_from_any_points_to_the_reference():
    with pytest.raises(TypeError, match=r"unknown setting `zzz`; every setting is listed in docs/settings\.md"):
        hybrid_callbacks(zzz=1)


def test_the_scheduler_takes_every_setting_hybrid_callbacks_takes_with_the_same_treatment():
    """One callback is the whole plugin: a component's setting goes to the component it brings, another mode's is
    checked and warned about, and one given beside a predictor instance names the place it belongs."""
    assert HybridScheduler(z_threshold=3.0).components[1].divergence.z_threshold == 3.0
    with pytest.warns(UserWarning, match=r"`decay` belongs to the per-step mode"):
        HybridScheduler(decay=0.5)
    with pytest.raises(TypeError, match=r"`decay` is a setting of LinearPredictor; with an instance, set it there"):
        HybridScheduler(predictor=LinearPredictor(), decay=0.5)


def test_the_scheduler_takes_the_default_rules_settings_and_checks_them_when_built():
    scheduler = HybridScheduler(warmup_steps=3, outer_lr=0.5, keep_norms=False)
    assert scheduler.config.warmup_steps == 3 and scheduler.rule_settings == {"outer_lr": 0.5, "keep_norms": False}
    with pytest.raises(ValueError, match=r"OuterMomentum: `outer_lr` must be a finite number in \(0.0, 2.0\], got 5"):
        HybridScheduler(outer_lr=5)


def test_the_other_modes_settings_are_checked_and_warned_about_never_refused():
    """One treatment for a setting the running mode does not read, a component's or another predictor's: it is
    checked by its owner (a bad value fails as it would there) and warned about once, naming its mode."""
    with pytest.warns(
        UserWarning,
        match=r"`max_predict_steps`, `confidence_threshold`, `max_correction_factor`, `decay` belong to "
        r"the per-step mode \(predictor='linear', 'mlp' or 'rssm'\); predictor='outer' runs the jumps mode",
    ):
        hybrid_callbacks(max_predict_steps=5, confidence_threshold=0.9, max_correction_factor=3.0, decay=0.9)
    with pytest.warns(UserWarning, match=r"`outer_lr` belongs to the jumps mode \(predictor='outer'\); predictor="):
        hybrid_callbacks(predictor="linear", outer_lr=0.5)
    with pytest.raises(ValueError, match=r"LinearPredictor: `decay` must be a finite number in"):
        hybrid_callbacks(decay=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hybrid_callbacks(predictor="linear", max_predict_steps=5, confidence_threshold=0.9)  # read: no warning
        hybrid_callbacks(z_threshold=3.0, full_steps=10)  # the default reads both


def test_a_setting_two_components_share_is_refused(monkeypatch):
    from lightning_hybrid import predictors

    @dataclass(eq=False)
    class Clashing(LinearPredictor):
        name = "clashing"
        z_threshold: float = setting(1.0, "a name the monitor's setting has too", Float(0.0))

    monkeypatch.setitem(predictors.PREDICTORS, "clashing", Clashing)
    with pytest.raises(TypeError, match="`z_threshold` is ambiguous"):
        hybrid_callbacks(predictor="clashing", z_threshold=2.0)


def test_settings_reach_their_component():
    callbacks = hybrid_callbacks(
        predictor="linear", z_threshold=7.0, max_correction_factor=3.0, decay=0.8, max_consecutive_rollbacks=2
    )
    assert {type(cb).__name__ for cb in callbacks} >= {"HybridScheduler", "DynamicsPredictor"}
    by_type = {type(cb): cb for cb in callbacks}
    assert by_type[DivergenceMonitor].divergence.z_threshold == 7.0
    assert by_type[ResidualCorrector].correction.max_correction_factor == 3.0
    assert by_type[DynamicsPredictor].predictor.decay == 0.8
    scheduler = next(cb for cb in callbacks if type(cb).__name__ == "HybridScheduler")
    assert scheduler.config.max_consecutive_rollbacks == 2


@pytest.mark.parametrize(
    ("factory", "pattern"),
    [
        (lambda: DivergenceMonitor(z_threshold=0), "`z_threshold`"),
        (lambda: DivergenceMonitor(oscillation_window=-1), "`oscillation_window`"),
        (lambda: OuterMomentum(verify_resolution=-0.1), "`verify_resolution` must be a finite number in"),
        (lambda: OuterMomentum(verify_window=-1), "`verify_window`"),
        (lambda: ResidualCorrector(max_correction_factor=0.5), "`max_correction_factor`"),
        (lambda: ResidualCorrector(time_decay=0.0), "`time_decay`"),
        (lambda: ResidualCorrector(neighbours=0), "`neighbours`"),
        (lambda: LinearPredictor(decay=float("nan")), "`decay`"),
        (lambda: LinearPredictor(loss_window=2), "`loss_window` must be an integer >= 3, got 2"),
    ],
)
def test_component_settings_are_validated(factory, pattern):
    with pytest.raises(ValueError, match=pattern):
        factory()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"bandit": "False"}, r"hybrid_callbacks: `bandit` must be True, False or None, got 'False'"),
        ({"bandit": False, "alpha": -1}, r"HorizonBandit: `alpha` must be a finite number in \[0.0, inf\), got -1"),
        ({"feature_dim": 0}, r"DynamicsPredictor: `feature_dim` must be an integer >= 14, got 0"),
    ],
)
def test_small_validation_gaps_are_closed(settings, match):
    with pytest.raises(ValueError, match=match):
        hybrid_callbacks(**settings)


@pytest.mark.parametrize("full_steps", [2, 3, 5, 20, 100])
def test_any_cycle_length_set_alone_trains_and_jumps(full_steps):
    """The verdict's window follows the cycle (half of it, 10 for the default 20): a cycle length set alone is never
    refused for a window the user did not set, and the default jumps at it."""
    from tests.helpers import RegressionModel, hybrid_trainer, loader, scheduler_of

    trainer, _ = hybrid_trainer(100 + 4 * full_steps + 2, hybrid=hybrid_callbacks(full_steps=full_steps))
    trainer.fit(RegressionModel(), loader(2048, batch_size=128))  # batches whose losses let the verdict see
    summary = scheduler_of(trainer).summary()
    assert summary["settings"]["verify_window"] == max(1, full_steps // 2)
    assert summary["jumps_made"] >= 1 and summary["steps_total"] == trainer.global_step


def test_a_window_set_longer_than_the_cycle_set_with_it_is_refused_before_training():
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from tests.helpers import RegressionModel, hybrid_trainer, loader

    trainer, _ = hybrid_trainer(10, hybrid=hybrid_callbacks(full_steps=5, verify_window=6))
    with pytest.raises(MisconfigurationException, match=r"`verify_window` must be at most full_steps \(5\).*got 6"):
        trainer.fit(RegressionModel(), loader())
    assert trainer.global_step == 0


def _every_owner() -> list[type]:
    from lightning_hybrid.predictors import PREDICTORS
    from lightning_hybrid.setting_owners import SETTING_OWNERS

    return [*SETTING_OWNERS.values(), *PREDICTORS.values()]


def test_each_setting_is_declared_once_with_a_description_and_a_default_its_check_takes():
    """A setting's one declaration holds everything the surfaces read: a description, and a default that passes its
    own check. A name is declared in one place (a subclass inherits it, or takes another default with the same
    description), except ``fused``: each rule's kernels, set on that rule."""
    from lightning_hybrid.settings import declared

    descriptions: dict[str, set[str]] = {}
    for cls in _every_owner():
        for s in declared(cls):
            assert s.doc and not s.doc.endswith("."), (cls.__name__, s.name)
            assert s.check(cls.__name__, s.name, s.default) == s.default, (cls.__name__, s.name)
            descriptions.setdefault(s.name, set()).add(s.doc)
    assert {name for name, docs in descriptions.items() if len(docs) > 1} == {"fused"}


def test_the_families_read_what_the_declarations_say():
    from lightning_hybrid.engine import FAMILIES

    assert FAMILIES["jumps"].phase_settings == (
        "warmup_steps",
        "full_steps",
        "max_consecutive_rollbacks",
        "enable_prediction",
    )
    assert FAMILIES["jumps"].monitor_settings == ("z_threshold", "stats_decay", "grad_outlier_factor")
    assert FAMILIES["averaging"].phase_settings == ("warmup_steps", "enable_prediction")
    assert FAMILIES["averaging"].monitor_settings == ("grad_outlier_factor",)
    assert len(FAMILIES["segments"].phase_settings) == 14 and len(FAMILIES["segments"].monitor_settings) == 5


def test_a_predictor_hydra_made_into_a_config_is_named_as_such():
    """Hydra turns a dataclass passed to ``instantiate`` as a keyword into a config; the predictors are dataclasses,
    so the plugin says what happened instead of failing on a config's missing attribute."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    with pytest.raises(
        InstantiationException, match=r"`predictor` must be a registered name .* got a DictConfig: a config"
    ):
        instantiate({"_target_": "lightning_hybrid.HybridScheduler"}, predictor=OuterMomentum())
    built = instantiate({"_target_": "lightning_hybrid.HybridScheduler", "predictor": {"_target_": OUTER}})
    assert isinstance(built.components[0].predictor, OuterMomentum)  # the config nested: Hydra builds it


OUTER = "lightning_hybrid.predictors.OuterMomentum"
