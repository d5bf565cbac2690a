"""The package's import graph points only down its layers and has no circle, counting every import: module level,
inside functions and under ``TYPE_CHECKING``. A training step starts at the strategy, which knows only the engine's
small interface; the callbacks know the strategy and the engine; nothing below knows the callbacks. The algorithm
(``engine/``, ``predictors/``, ``algorithms/``) is plain torch: it imports no Lightning at all.

The benchmarks have no circle either, and their drivers import none of each other. In the tests, no module
imports a test module: what several share lives in ``tests/helpers.py`` (or
``tests/conftest.py``)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_hybrid"
TESTS = Path(__file__).resolve().parent

# Lowest first. A module may import modules of its own layer or of any layer below it.
LAYERS = [
    (
        "core",
        (
            "settings",
            "phase",
            "stats",
            "config",
            "summary",
            "offload",
            "encoder",
            "predictors",
            "algorithms",
            "tensorboard",
            "outputs",
            "lightning_packages",
        ),
    ),
    ("engine", ("engine",)),
    ("loop", ("setting_owners", "loop")),  # the plugin's settings and a loop's door: plain torch, as the engine
    ("strategy", ("samplers", "step_routing", "strategy", "fsdp", "registry")),
    ("callbacks", ("callbacks", "meter")),
    ("app", ("hydra_settings", "comparison", "runner", "resume", "train", "demos", "__init__")),
]


PLAIN_TORCH = ("engine", "predictors", "algorithms", "setting_owners")  # they must not import Lightning


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, prefix: str = "lightning_hybrid") -> set[str]:
    """Every module whose name starts with ``prefix`` that ``path`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name == prefix or name.startswith(f"{prefix}.")}


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in root.rglob("*.py")}
    prefix = root.name
    return {name: {i for i in imports_of(path, prefix) if i in modules and i != name} for name, path in modules.items()}


def layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for rank, (_, members) in enumerate(LAYERS):
        if top in members:
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def test_every_import_points_down_or_sideways():
    upward = [
        f"{m} ({LAYERS[layer(m)][0]}) imports {i} ({LAYERS[layer(i)][0]})"
        for m, targets in graph().items()
        for i in targets
        if layer(i) > layer(m)
    ]
    assert not upward, "\n".join(upward)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


@pytest.mark.parametrize("root", [PACKAGE, PACKAGE.parent / "benchmarks"], ids=["package", "benchmarks"])
def test_no_import_circle(root):
    cycle = find_cycle(graph(root))
    assert cycle is None, " -> ".join(cycle)


def test_no_benchmark_driver_imports_another():
    """The drivers share the harness's core (and the task, curve, report and peer modules), never each other, but
    for the GPU command's grid, which runs the scale grid's GPU cells."""
    drivers = {"benchmarks.run", "benchmarks.lrs", "benchmarks.overheads", "benchmarks.gpu", "benchmarks.long_run"}
    drivers |= {"benchmarks.host_work", "benchmarks.checkpoint_size", "benchmarks.scale"}
    edges = graph(PACKAGE.parent / "benchmarks")
    assert drivers <= set(edges), drivers - set(edges)
    crossing = [f"{d} imports {i}" for d in drivers for i in edges[d] if i in drivers]
    crossing.remove("benchmarks.gpu imports benchmarks.scale")
    assert not crossing, crossing
    assert not list((PACKAGE.parent / "benchmarks" / "results").rglob("*.py"))  # results hold no code


@pytest.mark.parametrize(
    "edges, expected",
    [({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]), ({"a": {"b"}, "b": set(), "c": {"a"}}, None)],
)
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert find_cycle(edges) == expected


@pytest.mark.parametrize("package", PLAIN_TORCH)
def test_the_algorithm_imports_no_lightning(package):
    module = PACKAGE / f"{package}.py"
    files = [module] if module.is_file() else sorted((PACKAGE / package).rglob("*.py"))
    assert files
    found = {f"{p.relative_to(PACKAGE)}: {sorted(i)}" for p in files if (i := imports_of(p, "lightning"))}
    assert not found, found


def test_the_lightning_check_sees_an_import_of_lightning(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from lightning.pytorch.utilities import rank_zero_info\n")
    assert imports_of(module, "lightning") == {
        "lightning.pytorch.utilities",
        "lightning.pytorch.utilities.rank_zero_info",
    }
    module.write_text("import lightning_hybrid.engine\n")
    assert imports_of(module, "lightning") == set()


def imported_test_modules(path: Path, package: str) -> set[str]:
    """The test modules (a name starting ``test_``) of ``tests`` that ``path``, a module of ``package``, imports:
    ``import tests.test_x``, ``from tests.test_x import ...``, ``from tests import test_x``, relative ones too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, one level up per dot after the first
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    modules = set()
    for parts in (name.split(".") for name in found if name.startswith("tests.")):
        for at, part in enumerate(parts):
            if part.startswith("test_"):
                modules.add(".".join(parts[: at + 1]))
                break
    return modules


def test_no_module_under_tests_imports_a_test_module():
    files = sorted(TESTS.rglob("*.py"))
    assert TESTS / "helpers.py" in files
    found = [
        f"{path.relative_to(TESTS.parent).as_posix()} imports {name}"
        for path in files
        for name in sorted(imported_test_modules(path, ".".join(path.parent.relative_to(TESTS.parent).parts)))
    ]
    assert not found, "move what they share into tests/helpers.py:\n" + "\n".join(found)


def test_the_test_module_check_sees_each_form_of_import(tmp_path):
    module = tmp_path / "m.py"
    forms = {
        "from tests.test_app import TINY": {"tests.test_app"},
        "from tests import test_app, helpers": {"tests.test_app"},
        "import tests.test_app": {"tests.test_app"},
        "def f():\n    import tests.test_app as app": {"tests.test_app"},
        "from tests.faults.test_faults import x": {"tests.faults.test_faults"},
        "from .test_app import TINY": {"tests.test_app"},
        "from . import test_app": {"tests.test_app"},
        "from ..test_app import TINY": {"tests.test_app"},
        "from tests.helpers import run_ranks": set(),
        "from tests import helpers": set(),
        "import pytest": set(),
    }
    for source, expected in forms.items():
        module.write_text(source + "\n")
        package = "tests.faults" if source.startswith("from ..") else "tests"
        assert imported_test_modules(module, package) == expected, source
