"""`slotune tune --trace`: local mode replays a segment of the shipped Azure trace against real runtime processes
(the tiny model), rate scaled to this CPU, window by window to the segment's end; its SLO holds and the report shows
the share of requests meeting it and the replica-seconds spent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.e2e.test_local_mode import scenario, tune

ROOT = Path(__file__).resolve().parents[2]
AZURE = ROOT / "bench" / "traces" / "azure-llm-2023-conv.csv"


@pytest.mark.usefixtures("model_cache")
def test_tune_replays_a_trace_segment_and_reports_attainment_and_replica_seconds(tmp_path: Path) -> None:
    # A comfortable start (16 sequences) under an open-loop 2 req/s: this is about the replay, not the search.
    path = scenario(tmp_path, "trace-tiny", runtime={"engine": "builtin", "config": {"maxNumSeqs": 16,
                                                                                     "maxNumBatchedTokens": 1024}},
                    slo={"ttft": {"p99": 2000}, "tpot": {"p99": 250}})
    out = tmp_path / "run"
    # The trace's first 45 s (113 requests) at 2 req/s: a 57 s segment, 8 windows of 8 s.
    completed = tune(path, out, "--trace", str(AZURE), "--trace-rate", "2", "--trace-duration-s", "45",
                     "--max-prompt-tokens", "600", "--max-output-tokens", "16")
    assert (out / "trace_replay.json").exists(), completed.stdout[-2000:] + completed.stderr[-3000:]
    replayed = json.loads((out / "trace_replay.json").read_text())
    assert replayed["rate_per_s"] == pytest.approx(2.0, rel=0.01)
    # The whole segment, though the loop comes to rest before its end, and every request of it.
    assert len(replayed["windows"]) == math.ceil(replayed["segment_s"] / 8) >= 7
    assert replayed["requests"] == replayed["planned_requests"] == 113
    assert replayed["attainment"] >= 0.95
    assert replayed["replica_seconds"] >= 8 * len(replayed["windows"])
    markdown = (out / "report.md").read_text()
    assert "## Trace replay" in markdown and f"{replayed['replica_seconds']:.0f}" in markdown
