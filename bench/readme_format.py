"""How the README's rendered pieces write numbers and tables: one result file's JSON, ratios, shares, rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Result = dict[str, Any]  # one parsed result file; read only by the README's renderers


def load(results: Path, name: str) -> Result:
    return json.loads((results / f"{name}.json").read_text())


def times(ratio: float) -> str:
    return f"{ratio:.2f}x"


def count(value: float) -> str:
    """Configurations counts: medians can be halves (3.5), never more precise."""
    return f"{round(value, 1):g}"


def pct(fraction: float) -> str:
    return f"{fraction:.0%}"


def row(what: str, result: str, file: str) -> str:
    return f"| {what} | {result} | `bench/results/{file}` |"


def block(lines: list[str]) -> str:
    return "\n" + "\n".join(lines) + "\n"


def machines(results: list[Result]) -> str:
    """'2-core AMD EPYC', or each distinct machine when the results were measured on more than one."""
    found = dict.fromkeys(f"{m.get('cores', m.get('cpu_cores'))}-core {m.get('cpu', m.get('cpu_model'))}"
                          for m in (r["machine"] for r in results))
    return " and ".join(found)
