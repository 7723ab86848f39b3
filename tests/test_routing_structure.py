"""The routing package's shape: no import cycles (imports inside functions and under
TYPE_CHECKING count), `routing/` never imports `gateway/`, and no module of the decision path
(what routing.dispatch and routing.policies import) is over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """Every module of `known` that `path` imports, wherever the import statement sits."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def graph_of(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    known = set(mods)
    # Importing `a.b` runs package `a` first: a module's own parent packages are not edges.
    return {name: {m for m in imports(path, known) if m != name and not name.startswith(m + ".")}
            for name, path in mods.items()}


@pytest.mark.parametrize("package", ["routing"])
def test_no_import_cycles(package: str) -> None:
    assert cycle_in(graph_of(package)) is None


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None


def test_routing_never_imports_gateway() -> None:
    known = set(modules("gateway"))
    offenders = {name: imports(path, known) for name, path in modules("routing").items()}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_every_module_of_the_decision_path_is_under_400_lines() -> None:
    graph = graph_of("routing")
    path, todo = set(), ["routing.dispatch", "routing.policies"]
    while todo:
        name = todo.pop()
        if name not in path:
            path.add(name)
            todo.extend(graph[name])
    assert {"routing.scheduling.facts", "routing.predict", "routing.cost"} <= path
    sizes = {name: len(modules("routing")[name].read_text(encoding="utf-8").splitlines())
             for name in path}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
