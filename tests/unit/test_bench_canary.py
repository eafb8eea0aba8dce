"""The committed canary benchmark result was made with the benchmark's defaults, so a rerun repeats it; read from the
source (importing the benchmark would import torch)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_canary.py"


def _defaults() -> dict[str, object]:
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(node.args[0], ast.Constant) and isinstance(default, ast.Constant):
                found[node.args[0].value] = default.value
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "WINDOW_REQUESTS":
            found["WINDOW_REQUESTS"] = ast.literal_eval(node.value)
    return found


def test_committed_canary_result_is_what_the_defaults_run() -> None:
    result = json.loads((ROOT / "bench" / "results" / "canary.json").read_text())
    assert _defaults() == {"--trials": result["trials"], "--slow-trials": result["slow_trials"],
                           "--ramp-trials": result["ramp_trials"], "WINDOW_REQUESTS": result["window_requests"]}
    assert len(result["real"]["a_a"]["trials"]) >= 20  # the bar for the A/A false-promote rate
