"""Trace replay as a workload: both recorded formats read and detected, segments cut and time-scaled, lengths limited,
the same requests every time, and Mooncake's hash ids turned into shared prompt blocks (in the plan and the text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotune.loadgen.prompts import load_trace, prompt_for
from slotune.traces import BLOCK_TOKENS, TraceFormat, TraceReplay, detect_format, plan_trace, rate_per_minute


def azure(tmp_path: Path, rows: list[tuple[str, int, int]]) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows))
    return path


def mooncake(tmp_path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": h}) + "\n"
                            for t, p, o, h in rows))
    return path


def test_azure_rows_become_requests_from_zero(tmp_path: Path) -> None:
    path = azure(tmp_path, [("2023-11-16 18:15:48.1000000", 20, 4), ("2023-11-16 18:15:46.6805900", 374, 44)])
    planned = plan_trace(TraceReplay(path))
    assert planned.trace_format is TraceFormat.AZURE
    assert [(round(r.arrival_s, 4), r.prompt_tokens, r.output_tokens) for r in planned.requests] == [
        (0.0, 374, 44), (1.4194, 20, 4)]
    assert all(r.prefix_block_ids == () for r in planned.requests)


def test_mooncake_milliseconds_and_full_blocks(tmp_path: Path) -> None:
    path = mooncake(tmp_path, [(0, 1100, 5, [0, 1, 2]), (2500, 600, 7, [0, 3])])
    planned = plan_trace(TraceReplay(path))
    assert planned.trace_format is TraceFormat.MOONCAKE
    first, second = planned.requests
    assert second.arrival_s == 2.5
    # 1100 tokens hold two full 512-token blocks; the partial third is not a shared block.
    assert (first.prefix_block_ids, first.shared_prefix_tokens) == ((0, 1), 2 * BLOCK_TOKENS)
    assert (second.prefix_block_ids, second.shared_prefix_tokens) == ((0,), BLOCK_TOKENS)


def test_format_is_detected_named_or_refused(tmp_path: Path) -> None:
    assert detect_format(azure(tmp_path, [("2023-11-16 18:15:46", 3, 1)])) is TraceFormat.AZURE
    assert detect_format(mooncake(tmp_path, [(0, 3, 1, [])])) is TraceFormat.MOONCAKE
    other = tmp_path / "own.jsonl"
    other.write_text(json.dumps({"timestamp": 0, "prompt_tokens": 3, "output_tokens": 1}) + "\n")
    with pytest.raises(ValueError, match="neither a Mooncake"):
        detect_format(other)
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,0,3\n")
    with pytest.raises(ValueError, match=r"bad\.csv:2"):
        plan_trace(TraceReplay(bad, TraceFormat.AZURE))


def test_time_scaling_hits_the_target_rate_and_keeps_the_shape(tmp_path: Path) -> None:
    # 10 requests in the first minute, 30 in the second: a 1:3 shape over 120 s (1/3 req/s).
    times = [i * 6000 for i in range(10)] + [60000 + i * 2000 for i in range(30)]
    path = mooncake(tmp_path, [(t, 10, 2, []) for t in times])
    planned = plan_trace(TraceReplay(path, rate_per_s=2.0, duration_s=120.0))
    assert planned.rate_per_s == pytest.approx(2.0)
    assert planned.time_scale == pytest.approx(2.0 / (40 / 120))
    rates = rate_per_minute(planned.requests, planned.duration_s, bin_s=planned.duration_s / 2)
    assert rates[1] / rates[0] == pytest.approx(3.0)


def test_start_offset_duration_and_length_limits(tmp_path: Path) -> None:
    path = mooncake(tmp_path, [(t * 1000, 2000 + t, 900, [t]) for t in range(10)])
    planned = plan_trace(TraceReplay(path, start_s=3.0, duration_s=4.0, max_prompt_tokens=1024,
                                     max_output_tokens=100))
    assert [r.arrival_s for r in planned.requests] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert {r.prompt_tokens for r in planned.requests} == {1024}
    assert {r.output_tokens for r in planned.requests} == {100}
    assert (planned.num_prompts_cut, planned.num_outputs_cut) == (5, 5)
    with pytest.raises(ValueError, match="no requests"):
        plan_trace(TraceReplay(path, start_s=100.0))


def test_replay_is_deterministic(tmp_path: Path) -> None:
    path = mooncake(tmp_path, [(t * 370, 700 + 13 * t, 5 + t, [0, t]) for t in range(50)])
    replay = TraceReplay(path, rate_per_s=3.0, start_s=1.0, duration_s=10.0, max_prompt_tokens=900)
    assert plan_trace(replay) == plan_trace(replay)
    assert [r.planned for r in load_trace(path, replay)] == list(plan_trace(replay).requests)


def test_identical_block_ids_give_identical_prompt_text(tmp_path: Path) -> None:
    path = mooncake(tmp_path, [(0, 1600, 3, [0, 1, 2, 9]), (10, 1100, 3, [0, 1, 5]), (20, 1100, 3, [0, 4, 5])])
    first, second, third = (prompt_for(r.planned, i, tokens_per_word=1.0)
                            for i, r in enumerate(load_trace(path)))
    words_per_block = BLOCK_TOKENS
    shared = " ".join(first.split()[: 2 * words_per_block])
    assert second.startswith(shared + " ")  # blocks 0 and 1 agree word for word
    assert first.split()[:words_per_block] == third.split()[:words_per_block]  # block 0 only
    assert first.split()[words_per_block:2 * words_per_block] != third.split()[words_per_block:2 * words_per_block]
    assert len(first.split()) == pytest.approx(1600, abs=2)
