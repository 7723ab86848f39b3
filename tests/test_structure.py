"""The product's shape, as specifications: no import cycles among `gateway/` and `routing/`
(imports inside functions and under TYPE_CHECKING count), `routing/` never imports `gateway/`,
no product module over 400 lines, and `docs/design.md` names only modules that exist and
import."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("gateway", "routing")
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every product module `name` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            # `import a.b.c` also runs a and a.b: the nearest known module is the dependency.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_cycles_among_product_modules() -> None:
    assert _cycles(_graph()) == []


def test_routing_never_imports_gateway() -> None:
    upward = {name: sorted(d for d in deps if d.split(".")[0] == "gateway")
              for name, deps in _graph().items() if name.split(".")[0] == "routing"}
    assert {name: deps for name, deps in upward.items() if deps} == {}


def test_no_product_module_over_400_lines() -> None:
    big = {name: n for name, path in _modules().items()
           if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


DESIGN = ROOT / "docs" / "design.md"
NAMED = sorted(set(re.findall(r"\b((?:gateway|routing|loadtest)/[\w/]+\.py)\b",
                              DESIGN.read_text()))) if DESIGN.exists() else []


def test_design_doc_names_modules() -> None:
    assert len(NAMED) >= 20


@pytest.mark.parametrize("path", NAMED)
def test_every_module_the_design_doc_names_exists_and_imports(path: str) -> None:
    assert (ROOT / path).is_file(), f"docs/design.md names {path}, which does not exist"
    importlib.import_module(_module_name(ROOT / path))
