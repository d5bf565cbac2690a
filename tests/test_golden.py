"""The golden runs of ``tests/golden.py`` (every phase, rollbacks, back-off, the gate, offload, the bandit, manual
optimization, resume from this and earlier checkpoint layouts, DDP, FSDP and the trajectory rules) behave as
recorded, on any machine: refactors change no behaviour. Where the record holds this platform's parameter hashes,
the final weights are compared bitwise too; on the platform that recorded the floats, every float is."""

import json

import pytest

from tests.golden import RANKS, RECORD, REL_TOL, differences, platform_key, ranks_outcome, run_all

RECORDED = json.loads(RECORD.read_text())
KEY = platform_key(RECORDED["platforms"])

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xdist_group("ranks")) if n in RANKS else n for n in sorted(RECORDED["runs"])],
)
def test_golden_run_behaves_as_recorded(name, request):
    want = RECORDED["runs"][name]
    if name in RANKS:  # the suite's one launch of two ranks ran it (tests/conftest.py)
        got = ranks_outcome(request.getfixturevalue("distributed_runs")[1][RANKS[name]])
    else:
        got = run_all([name])[name]
    exact = want.get("recorded_on", RECORDED["recorded_on"]) == KEY
    assert not differences(want["behaviour"], got["behaviour"], exact_floats=exact), (
        f"{name} behaves differently from the record (floats compared "
        f"{'bitwise' if exact else f'within {REL_TOL} relative'}):\n"
        + "\n".join(differences(want["behaviour"], got["behaviour"], exact))
    )
    if KEY in want["params_sha256"]:
        assert got["params_sha256"] == want["params_sha256"][KEY], f"{name}: the final weights differ bitwise"


def test_every_run_checks_behaviour_beyond_the_hashes():
    """A machine without recorded hashes still compares something in every run: its phases or losses."""
    for name, run in RECORDED["runs"].items():
        behaviour = run["behaviour"]
        assert behaviour["summary"]["steps_total"] > 0, name
        assert behaviour.get("phases") or behaviour.get("losses"), name


def test_the_comparison_catches_what_it_must():
    want = {"phases": "0112", "summary": {"rollbacks": 1}, "losses": [1.0, 0.5]}
    assert not differences(want, {"phases": "0112", "summary": {"rollbacks": 1}, "losses": [1.0, 0.50001]}, False)
    assert differences(want, {"phases": "0112", "summary": {"rollbacks": 1}, "losses": [1.0, 0.50001]}, True)
    assert differences(want, {"phases": "0111", "summary": {"rollbacks": 1}, "losses": [1.0, 0.5]}, False)
    assert differences(want, {"phases": "0112", "summary": {"rollbacks": 2}, "losses": [1.0, 0.5]}, False)
    assert differences(want, {"phases": "0112", "summary": {"rollbacks": 1}, "losses": [1.0, 0.51]}, False)
    assert differences(want, {"phases": "0112", "summary": {"rollbacks": 1}, "losses": [1.0]}, False)
