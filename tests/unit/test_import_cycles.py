"""No import cycles: the module import graph of a package, read from the source with `ast` (every import, including
ones inside functions and under `TYPE_CHECKING`), has no cycle. A cycle means two modules that cannot be understood,
tested or moved one without the other; it is named here by the imports that close it. Parametrized on the package
root so the runtime (gpu_runtime) can be held to it too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.import_graph import cycles, module_graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "operator" / "slotune"]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_cycles(package: Path) -> None:
    found = [" -> ".join(cycle) for cycle in cycles(module_graph(package))]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_checker_sees_a_cycle_through_an_import_inside_a_function(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")  # a re-export: not a cycle
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("B = 1\ndef f():\n    from ..sub.a import x\n")
    (package / "c.py").write_text("import pkg.sub.a\n")
    assert cycles(module_graph(package)) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]]
