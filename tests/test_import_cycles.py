"""No import cycle among the project's modules (runners/, portal/, servebench/).

A cycle works only while each side imports the other late enough, and a newcomer moving
one import to the top of a module finds out at start-up. The graph is read from the
source (``ast``), not by importing anything: an edge is any ``import`` or ``from ...
import`` of a project module, at module level or inside a function (a function-level
import is how a cycle hides), except under ``if TYPE_CHECKING:`` (never executed).
``from package import name`` is an edge to ``package.name`` when that is a module, else
to ``package``.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("runners", "portal", "servebench")

# Cycles known and owned elsewhere, each as its sorted modules with the owner who will
# remove it; every other cycle fails the test. Empty: none is known.
KNOWN: dict[tuple[str, ...], str] = {}


def project_sources() -> dict[str, tuple[str, bool]]:
    """Dotted module name -> (source, whether it is a package's ``__init__``), for every
    module of the project's packages."""
    sources = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            sources[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def _type_checking_only(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth."""
    for node in ast.iter_child_nodes(tree):
        if _type_checking_only(node):
            yield from (n for child in node.orelse for n in _imports_in(child))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for name, (text, is_package) in sources.items():
        edges: dict[str, int] = {}
        package = name.split(".") if is_package else name.split(".")[:-1]
        for node in _imports(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in sources]
            else:
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in sources:
                        targets.append(full)
                    elif source in sources:
                        targets.append(source)
            for target in targets:
                if target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
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

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(found)


def one_loop(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A path through ``component`` from its first module back to it, each step with the
    line of the import that makes it (``a:12 -> b``)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph[v]:
            if w == start:
                steps = [*paths[v], start]
                return [f"{a}:{graph[a][b]}" for a, b in itertools.pairwise(steps)] + [start]
            if w in members and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return component


def test_the_reader_sees_a_cycle_through_a_function_level_import():
    """The shape both cycles found here had: a module imports another at the top, which
    imports it back inside a function. A TYPE_CHECKING import is no edge."""
    sources = {
        "pkg": ("", True),
        "pkg.a": ("from pkg import b\n", False),
        "pkg.b": ("def f():\n    from .a import x\n", False),
        "pkg.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n", False),
    }
    graph = import_graph(sources)
    assert graph["pkg.c"] == {}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert one_loop(graph, ["pkg.a", "pkg.b"]) == ["pkg.a:1", "pkg.b:2", "pkg.a"]


def test_there_is_no_import_cycle():
    graph = import_graph(project_sources())
    found = [c for c in cycles(graph) if tuple(c) not in KNOWN]
    loops = "\n".join(" -> ".join(one_loop(graph, c)) for c in found)
    assert not found, f"import cycles (module:line of the import -> next module):\n{loops}"


def test_every_known_cycle_still_exists():
    """A known cycle that is gone must leave KNOWN, so it cannot come back unnoticed."""
    present = {tuple(c) for c in cycles(import_graph(project_sources()))}
    assert [k for k in KNOWN if k not in present] == []
