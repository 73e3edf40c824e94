"""The import graph of ``harness`` and ``miles_async_core`` has no cycle.

Every ``import`` statement counts, module level or inside a function: an import moved into
a function still ties the two modules together, it only hides the cycle from the
interpreter's start-up. The graph is read from the source with ``ast`` (nothing is
imported), so the check is fast and sees modules whose dependencies are not installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "miles_async_core")


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the packages."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (the longest known prefix of each name)."""
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _targets(module, is_package, node):
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_cycle_hidden_in_a_function_and_through_a_relative_import(tmp_path):
    pkg = tmp_path / "harness" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from harness.sub import c\n")
    (pkg / "c.py").write_text("import harness.sub.a\n")
    (pkg / "d.py").write_text("from harness.sub.a import g\n")  # imports into the cycle, not part of it
    graph = import_graph(module_files(tmp_path, ("harness",)))
    assert cycles(graph) == [["harness.sub.a", "harness.sub.b", "harness.sub.c"]]
    (pkg / "c.py").write_text("")
    assert cycles(import_graph(module_files(tmp_path, ("harness",)))) == []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(module_files(ROOT))


def test_harness_and_the_core_import_without_cycles(graph):
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the tree was read
    assert cycles(graph) == []


def test_the_core_never_imports_the_harness(graph):
    leaks = {
        m: sorted(t for t in targets if t.startswith("harness"))
        for m, targets in graph.items()
        if m.startswith("miles_async_core")
    }
    assert {m: t for m, t in leaks.items() if t} == {}
