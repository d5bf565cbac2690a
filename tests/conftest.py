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
