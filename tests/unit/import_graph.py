"""A Python package's imports read from its source with `ast`: every import counts, including ones inside functions
and under `TYPE_CHECKING`. Shared by the layer test (which part imports which) and the cycle test (which module
imports which); the package root is a parameter, so both the operator and the runtime can be checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # the imported module, absolute


def _absolute(node: ast.ImportFrom, path: Path, package_root: Path, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    base = parts[: len(parts) - node.level]
    return ".".join([*base, node.module] if node.module else base) or package


def imports_of(path: Path, package_root: Path) -> Iterator[Import]:
    """Each import in the file; `from X import name` also yields `X.name`, which is a module when `name` is one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (Import(path, node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path, package_root, package_root.name)
            yield Import(path, node.lineno, module)
            yield from (Import(path, node.lineno, f"{module}.{alias.name}") for alias in node.names)


def sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path, package_root: Path) -> str:
    """`slotune/loop/tuner.py` -> `slotune.loop.tuner`; a package's `__init__.py` is the package."""
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(package_root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports. `from X import name` imports the module `X.name` when there
    is one, else `X`. Importing a submodule does not count as importing its parent package's `__init__`: Python runs
    it first, but a package that re-exports its submodules is not a cycle."""
    paths = {module_name(p, package_root): p for p in sources(package_root)}
    return {name: _imported(path, package_root, set(paths)) - {name} for name, path in paths.items()}


def _imported(path: Path, package_root: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path, package_root, package_root.name)
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found |= submodules or {base}
            if len(submodules) < len(node.names):
                found.add(base)
    return found & modules


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan), as the path of imports
    that closes it, e.g. [a, b, a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while (top := stack.pop()) != node:
                component.add(top)
            components.append(component | {node})

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, c) for c in components if len(c) > 1]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first inside the component)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                frontier.append(nxt)
    raise AssertionError(f"no cycle through {start}")
