import os
import warnings

import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")


def pytest_report_header() -> str:
    """Which CPU kernels torch runs: a numeric threshold that holds on one instruction set may not on another."""
    return f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}"


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    """Trainers without a logger or root dir write to the working directory; keep that out of the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _quiet_and_deterministic():
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*litlogger.*")
        yield


@pytest.fixture(scope="session")
def distributed_runs(tmp_path_factory) -> tuple:
    """Every two-process scenario of ``tests/test_ddp.py``, ``tests/test_trajectory.py`` and the golden DDP runs, in
    two launches (a launch costs more than most fits): one node, each saving run followed by its resume from its
    second checkpoint; then two simulated nodes. ``(root, runs)``, ``runs[name]`` each rank's record. The tests
    that use it share one xdist worker (``xdist_group("ranks")``)."""
    from tests.helpers import DISTRIBUTED, SAME_RUN, SAVE_EVERY, run_scenarios

    root = tmp_path_factory.mktemp("ranks")
    resumed = {  # from each saving run's second checkpoint: step 32 (an epoch's end) or 40 (inside an epoch)
        name.replace("save", "resumed"): (
            kind,
            strategy,
            str(root / name / "ckpt" / f"step={2 * SAVE_EVERY[how]}.ckpt"),
            *batches,
        )
        for name, (kind, strategy, how, *batches) in DISTRIBUTED.items()
        if name.startswith("save")
    }
    runs = run_scenarios(root, DISTRIBUTED | resumed)  # in this order: each saving run before its resume
    runs |= {name: runs[saving] for name, saving in SAME_RUN.items()}
    runs |= run_scenarios(root, {"two-nodes": ("linear", "ddp", "")}, nodes=2)
    return root, runs
