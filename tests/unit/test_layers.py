"""The import layers of slotune (STYLE.md), enforced: a module imports only from its own layer or the ones below.

Operator, top to bottom: the entry points (CLI, kopf controller, local mode, benchmarks, API commands), where
runtimes run (backends, simulator), the tuning loop, the policy (diagnosis included), the verdicts (judge), the
builders and readers (perfmodel, manifests, metrics, loadgen), the API types, and at the bottom the vocabulary every
layer shares (knobs and their schema, settings, SLO targets, snapshots, workloads). Settings are passed down as
arguments, never imported up. The runtime and the operator share no Python imports at all: their contract is flags, HTTP
API and metrics (the knob schema crosses as a generated file, gpu_runtime/knob_schema.py).

Imports are read from the source with `ast`, so every import counts, including ones inside functions and under
`TYPE_CHECKING`. Every top-level part of slotune must be placed in a layer: a new module fails here until it is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOTUNE = ROOT / "operator" / "slotune"
GPU_RUNTIME = ROOT / "gpu_runtime"

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"cli", "__main__"},
    {"controller", "local", "tunerbench", "commands"},
    {"backends", "simulator"},
    {"loop"},
    {"policy"},
    {"judge"},
    {"perfmodel", "manifests", "metrics", "loadgen", "quality"},
    {"api"},
    {"knobs", "settings", "slo", "snapshot", "workload"},
))

# Upward imports that stay until their owner restructures them: (importer, imported) with the reason.
EXCEPTIONS: dict[tuple[str, str], str] = {}


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
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (Import(path, node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path, package_root, package_root.name)
            yield Import(path, node.lineno, module)
            # `from slotune import api` imports the submodule slotune.api
            if module == package_root.name:
                yield from (Import(path, node.lineno, f"{module}.{alias.name}") for alias in node.names)


def part_of(module: str) -> str | None:
    """The top-level part of slotune a module belongs to (`slotune.api.spec` -> `api`); None for the package."""
    names = module.split(".")
    return names[1] if len(names) > 1 and names[0] == "slotune" else None


def layer_of(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _own_part(path: Path) -> str:
    return path.relative_to(SLOTUNE).parts[0].removesuffix(".py")


def test_every_part_of_slotune_has_a_layer() -> None:
    parts = {_own_part(p) for p in _sources(SLOTUNE)} - {"__init__"}
    placed = set().union(*LAYERS)
    assert not parts - placed, f"place these in LAYERS: {sorted(parts - placed)}"


def upward_imports() -> list[str]:
    found = []
    for path in _sources(SLOTUNE):
        importer = _own_part(path)
        if importer == "__init__":
            continue
        for imp in imports_of(path, SLOTUNE):
            imported = part_of(imp.module)
            if imported is None or imported == importer or (importer, imported) in EXCEPTIONS:
                continue
            if layer_of(imported) < layer_of(importer):
                found.append(f"{imp.path.relative_to(ROOT)}:{imp.line}: {importer} imports {imp.module} (a higher "
                             f"layer)")
    return found


def test_no_upward_imports_in_slotune() -> None:
    assert upward_imports() == []


def test_every_exception_is_still_needed() -> None:
    """An exception whose import is gone must go too, or it would silently allow the import to come back."""
    needed = set()
    for path in _sources(SLOTUNE):
        importer = _own_part(path)
        needed |= {(importer, part_of(i.module)) for i in imports_of(path, SLOTUNE)}
    assert set(EXCEPTIONS) <= needed


@pytest.mark.parametrize(("root", "forbidden"), [(SLOTUNE, "gpu_runtime"), (GPU_RUNTIME, "slotune")])
def test_slotune_and_the_runtime_share_no_imports(root: Path, forbidden: str) -> None:
    crossing = [f"{i.path.relative_to(ROOT)}:{i.line}: {i.module}" for p in _sources(root)
                for i in imports_of(p, root) if i.module.split(".")[0] == forbidden]
    assert crossing == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a relative upward import inside a function is found and resolved."""
    package = tmp_path / "slotune"
    (package / "api").mkdir(parents=True)
    source = package / "api" / "spec.py"
    source.write_text("def f():\n    from ..controller import run\n")
    assert [part_of(i.module) for i in imports_of(source, package)] == ["controller"]
    assert layer_of("controller") < layer_of("api")
