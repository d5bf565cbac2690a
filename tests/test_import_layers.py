"""The package's import graph points only down its layers and has no circle, counting every import: module level,
inside functions and under ``TYPE_CHECKING``. A training step starts at the strategy, which knows only the engine's
small interface; the callbacks know the strategy and the engine; nothing below knows the callbacks. The algorithm
(``engine/``, ``predictors/``, ``algorithms/``) is plain torch: it imports no Lightning at all."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_hybrid"

# Lowest first. A module may import modules of its own layer or of any layer below it.
LAYERS = [
    (
        "core",
        (
            "validation",
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
        ),
    ),
    ("engine", ("engine",)),
    ("strategy", ("strategy", "fsdp", "registry")),
    ("callbacks", ("callbacks", "meter")),
    ("app", ("schema", "runner", "resume", "train", "demos", "__init__")),
]


PLAIN_TORCH = ("engine", "predictors", "algorithms")  # packages that must not import Lightning


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


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in imports_of(path) if i in modules and i != name} for name, path in modules.items()}


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


def test_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize(
    "edges, expected",
    [({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]), ({"a": {"b"}, "b": set(), "c": {"a"}}, None)],
)
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert find_cycle(edges) == expected


@pytest.mark.parametrize("package", PLAIN_TORCH)
def test_the_algorithm_imports_no_lightning(package):
    files = sorted((PACKAGE / package).rglob("*.py"))
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
