import importlib.util
import os
import warnings

import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")
if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused jump's kernels run in Triton's interpreter


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


def _once_per_suite(tmp_path_factory, group: str) -> None:
    """Fail where a second xdist worker sets up ``group``'s fixture: its tests should share one worker
    (``--dist loadgroup``), and a pytest that breaks the grouping (9.2, pytest-xdist#1386) would launch it twice."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: nothing to share
        return
    shared = tmp_path_factory.getbasetemp().parent  # this run's folder, above each worker's own
    try:
        (shared / f"{group}.set-up").touch(exist_ok=False)
    except FileExistsError:
        pytest.fail(f"the {group!r} group's fixture was set up on a second worker: xdist's loadgroup did not group it")


@pytest.fixture(scope="session")
def distributed_runs(tmp_path_factory) -> tuple:
    """Every two-process scenario of ``tests/test_ddp.py``, ``tests/test_trajectory.py`` and the golden DDP runs, in
    one launch (a launch costs more than most fits): first two simulated nodes of one process each, whose placement
    is the process group's rendezvous, then one node of two, each saving run followed by its resume from its second
    checkpoint. ``(root, runs)``, ``runs[name]`` each rank's record. The tests that use it share one xdist worker
    (``xdist_group("ranks")``)."""
    from tests.helpers import DISTRIBUTED, SAME_RUN, SAVE_EVERY, run_scenarios

    _once_per_suite(tmp_path_factory, "ranks")
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
    two_nodes = {"two-nodes": ("linear", "ddp", "", "", 2)}  # first: the group's rendezvous is as two nodes'
    runs = run_scenarios(root, two_nodes | DISTRIBUTED | resumed)  # each saving run before its resume
    runs |= {name: runs[saving] for name, saving in SAME_RUN.items()}
    return root, runs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest groups first (the two-rank launch, the served TensorBoard page, then the launches of runs that
    kill themselves): xdist hands work out in collection order, and a long group handed out last would run alone at
    the end while the other core idles. Tests marked ``gpu`` skip where CUDA is absent."""
    first = ("ranks", "tensorboard_page", "killed_rank", "killed")

    def rank(item: pytest.Item) -> int:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        return next((first.index(g) for g in groups if g in first), len(first))

    items.sort(key=rank)  # stable: the rest keep their order
    if not torch.cuda.is_available():
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(pytest.mark.skip(reason="marked gpu: needs CUDA"))


@pytest.fixture
def fused_device(monkeypatch) -> str:
    """Where the rules' fused kernels run: on CUDA, or else on the CPU in Triton's interpreter; skipped without
    Triton, as on CI."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    from lightning_hybrid.predictors import fused_blocks

    monkeypatch.setattr(fused_blocks, "DEVICE_TYPES", {"cuda", "cpu"})
    return "cpu"


@pytest.fixture(params=["eager", "fused"])
def kernel_path(request) -> tuple[str, str]:
    """``(path, device)``: each step of a rule (an ``outer`` jump, a ``gpa`` average) made by the eager path on the
    CPU, or by the fused kernels."""
    return ("eager", "cpu") if request.param == "eager" else ("fused", request.getfixturevalue("fused_device"))
