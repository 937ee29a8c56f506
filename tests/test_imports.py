"""Modules import one another one way (issue 20 item 8): no import circle, and
a store module imports no feature module. Every import counts: at the top,
under TYPE_CHECKING and inside functions."""

from __future__ import annotations

import ast

from helpers import REPO

PACKAGE = REPO / "dblockrun"

#: The one circle left, inside the store package: Store hands itself to its
#: SQL helpers (control, items, status), which name its type back.
INSIDE_STORE = {"dblockrun.store.control", "dblockrun.store.items", "dblockrun.store.status",
                "dblockrun.store.store"}

#: What a store module may import from outside the store package.
STORE_MAY_IMPORT = {"dblockrun.errors", "dblockrun.config.jobs", "dblockrun.secretfile"}


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's name when
    its ``__init__`` is imported itself)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}"
                           if f"{node.module}.{alias.name}" in modules else node.module
                           for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module."""
    found: list[set[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        reach = _reachable(graph, start)
        component = {m for m in reach if start in _reachable(graph, m)} | {start}
        seen |= component
        if len(component) > 1:
            found.append(component)
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    stack, out = [start], set()
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in out:
                out.add(nxt)
                stack.append(nxt)
    return out


def test_no_import_circle_but_the_store_helpers() -> None:
    assert circles(imports()) == [INSIDE_STORE]


def test_store_modules_import_no_feature_module() -> None:
    graph = imports()
    outside = {(name, target) for name, targets in graph.items()
               if name.startswith("dblockrun.store") for target in targets
               if not target.startswith("dblockrun.store") and target not in STORE_MAY_IMPORT}
    assert outside == set()
