"""The house's size rules, so a newcomer reads a room at a time: no module over MAX_FILE_LINES lines and no function
over MAX_FUNCTION_LINES (from its `def` to its last line, decorators aside) in the operator or the runtime. A rule
broken is named here with where to look: split by responsibility, not by line count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "operator" / "slotune", ROOT / "gpu_runtime"]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 40


def long_functions(source: str) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_module_or_function_outgrows_the_house_rules(package: Path) -> None:
    files = sorted(package.rglob("*.py"))
    assert files, f"no modules under {package}"
    long_files = [f"{f.relative_to(ROOT)}: {n} lines" for f in files
                  if (n := len(f.read_text().splitlines())) > MAX_FILE_LINES]
    long_defs = [f"{f.relative_to(ROOT)}: {name} {n} lines" for f in files for name, n in long_functions(f.read_text())]
    assert long_files == [], f"modules over {MAX_FILE_LINES} lines:\n" + "\n".join(long_files)
    assert long_defs == [], f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long_defs)


def test_the_checker_counts_a_function_from_def_to_its_last_line() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_FUNCTION_LINES + 1)]
    assert long_functions(f"async def g():\n{body[:-len('    x39 = 39') - 1]}\n") == []
