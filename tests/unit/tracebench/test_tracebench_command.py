"""`slotune bench-traces` on trace files the project does not ship, one per format: it writes traces.json in the
issue's schema, traces.md and a plot, and a baseline meets its SLO where capacity suffices."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from slotune import cli

STRATEGIES = {"slotune", "static-peak", "queue-autoscaler", "saturation-autoscaler", "predictive-planner"}
FIGURES = {"attainment", "window_attainment", "gpu_hours", "changes_per_hour", "worst_window"}


def azure_trace(path: Path) -> Path:
    start = datetime(2024, 5, 1, 12, 0, 0)
    # Azure's stamps carry seven fractional digits: %f gives six, the seventh is padding.
    rows = [f"{(start + timedelta(seconds=i * 1.1)):%Y-%m-%d %H:%M:%S.%f}0,{300 + 7 * (i % 50)},{20 + i % 30}"
            for i in range(160)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def mooncake_trace(path: Path) -> Path:
    rows = [{"timestamp": int(i * 1300), "input_length": 1100 + 3 * i, "output_length": 30 + i % 20,
             "hash_ids": [0, 1 + i % 5, 100 + i]} for i in range(140)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("make", [azure_trace, mooncake_trace])
def test_bench_traces_writes_the_schema_and_a_baseline_meets_its_slo(tmp_path: Path, make) -> None:
    trace = make(tmp_path / ("trace.csv" if make is azure_trace else "trace.jsonl"))
    out = tmp_path / "out"
    code = cli.main(["bench-traces", "--trace", str(trace), "--model", "llama-3.1-8b", "--accelerator",
                     "nvidia-l4", "--rate", "1.0", "--duration-s", "150", "--startup-s", "30",
                     "--max-replicas", "3", "--slo", "ttft.p99=3000,tpot.p99=100", "--jobs", "1", "--out", str(out)])
    assert code == 0
    body = json.loads((out / "traces.json").read_text())
    (entry,) = body["traces"]
    assert set(entry) == {"trace", "model", "accelerator", "scaling", "strategies", "hindsight"}
    assert (entry["trace"], entry["model"], entry["accelerator"]) == (trace.name, "llama-3.1-8b", "nvidia-l4")
    assert entry["scaling"]["rate_per_s"] == pytest.approx(1.0, rel=0.02)
    assert {s["strategy"] for s in entry["strategies"]} == STRATEGIES
    for strategy in entry["strategies"]:
        assert set(strategy) >= FIGURES and set(strategy["first_pass"]) == FIGURES
        assert strategy["engine_config"] in {"default", "oracle", "tuned"}
        assert 0.0 <= strategy["attainment"] <= 1.0 and strategy["gpu_hours"] > 0
    static = next(s for s in entry["strategies"] if s["strategy"] == "static-peak" and s["engine_config"] == "default")
    assert static["attainment"] >= 0.99 and static["first_pass"]["attainment"] >= 0.99  # 1 req/s on an L4
    assert (out / "traces.md").read_text().count("| static-peak |") == 2
    for label in ("default", "oracle"):  # the foresight yardstick: 1 req/s needs one L4, known ahead or not
        yardstick = entry["hindsight"][label]
        assert yardstick["reached"] and yardstick["attainment"] >= 0.99 and yardstick["gpu_hours"] > 0
    assert "Hindsight pool" in (out / "traces.md").read_text()
    assert (out / f"traces-{trace.stem}.png").stat().st_size > 10_000
