"""Trace replay: JSONL parsing, the replayed window, and prompts for warm-up (negative) indices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotune.loadgen.prompts import load_trace, prompt_for
from slotune.loadgen.runner import trace_window
from slotune.workload import PlannedRequest


def _trace(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    return path


def test_trace_is_sorted_shifted_and_keeps_recorded_text(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path, [
        {"timestamp": 12.5, "prompt_tokens": 7, "output_tokens": 3},
        {"timestamp": 10.0, "prompt": "a b c d", "output_tokens": 2},
    ]))
    assert [(r.planned.arrival_s, r.planned.prompt_tokens, r.planned.output_tokens, r.prompt) for r in trace] == [
        (0.0, 4, 2, "a b c d"), (2.5, 7, 3, None)]


def test_bad_trace_line_names_file_and_line(tmp_path: Path) -> None:
    path = _trace(tmp_path, [{"timestamp": 0, "prompt_tokens": 3, "output_tokens": 1}, {"timestamp": 1}])
    with pytest.raises(ValueError, match=r"trace.jsonl:2"):
        load_trace(path)


def test_trace_window_cuts_by_count_or_arrival_time(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path, [{"timestamp": t, "prompt_tokens": 5, "output_tokens": 1} for t in range(5)]))
    assert len(trace_window(trace, None, None)) == 5
    assert [r.planned.arrival_s for r in trace_window(trace, 2, None)] == [0.0, 1.0]
    assert [r.planned.arrival_s for r in trace_window(trace, None, 2.5)] == [0.0, 1.0, 2.0]


def test_warmup_prompts_have_their_own_text_at_seed_zero() -> None:
    request = PlannedRequest(0.0, 12, 4, None, 0)
    warmup, measured = prompt_for(request, -1, seed=0), prompt_for(request, 1, seed=0)
    assert warmup.startswith("#-1 ") and measured.startswith("#1 ")
    assert warmup.split()[1:] != measured.split()[1:] and len(warmup.split()) == 12
