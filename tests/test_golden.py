"""The golden runs of ``tests/golden.py`` (every phase, rollbacks, back-off, the gate, offload, the bandit, manual
optimization, resume, DDP and FSDP) are bitwise what they were when recorded: refactors change no behaviour."""

import json

import pytest

from tests.golden import RECORD, platform, run_all

RECORDED = json.loads(RECORD.read_text())

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        RECORDED["platform"] != platform(),
        reason=f"recorded on {RECORDED['platform']}, this is {platform()}: kernels differ, so do the last bits "
        "(re-record with `python -m tests.golden` on a commit known to be right)",
    ),
]


@pytest.mark.parametrize("name", sorted(RECORDED["runs"]))
def test_golden_run_is_bitwise_unchanged(name):
    assert run_all([name])[name] == RECORDED["runs"][name]
