"""The opt-in step trace (GPU_RUNTIME_STEP_TRACE): off by default; on, one line per step with the step's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams, SchedulerKnobs
from gpu_runtime.engine.step_trace import STEP_TRACE_ENV


def _engine(path: Path) -> LLMEngine:
    knobs = SchedulerKnobs(max_num_seqs=4, max_num_batched_tokens=64)
    return LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=4 << 20, knobs=knobs))


def test_no_trace_unless_asked(nano_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STEP_TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    _engine(nano_llama).generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert list(tmp_path.iterdir()) == []


def test_trace_records_each_steps_prefill_chunks_and_decodes(nano_llama: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv(STEP_TRACE_ENV, str(trace))
    engine = _engine(nano_llama)
    prompts = [list(range(1, 101)), list(range(1, 11))]  # 100 tokens: two chunks under a 64-token budget
    engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rows) == engine.stats().num_steps
    first, second = rows[0], rows[1]
    assert (first["num_prefill_tokens"], first["num_prefill_seqs"], first["num_decode_seqs"]) == (64, 1, 0)
    assert first["num_new_seqs"] == 1
    # Next: the other 36 tokens of the long prompt (after 64 computed: context pairs 36 * 64) and the short prompt.
    assert (second["num_prefill_tokens"], second["num_prefill_seqs"], second["num_new_seqs"]) == (46, 2, 1)
    assert second["prefill_context_pairs"] == 36 * 64
    assert second["prefill_attention_tokens"] == pytest.approx(36 * (64 + 18) + 10 * 5)
    decodes = rows[2]
    assert (decodes["num_prefill_tokens"], decodes["num_decode_seqs"]) == (0, 2)
    assert decodes["decode_context_tokens"] == 101 + 11 and decodes["max_decode_context_tokens"] == 101
    assert all(row["end_s"] >= row["start_s"] for row in rows)
    assert sum(row["num_prefill_tokens"] for row in rows) == 110
    assert sum(row["num_decode_seqs"] for row in rows) == 2 * 3  # 4 tokens each: the first comes from the prefill
