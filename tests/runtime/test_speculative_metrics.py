"""The vllm:spec_decode_* series come from a real engine's counters through the runtime's metrics registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.server.metrics import RuntimeMetrics
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings


@pytest.fixture(scope="module")
def nano(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("spec_metrics") / "nano", preset="nano")


def _samples(metrics: RuntimeMetrics) -> dict[tuple[str, str], float]:
    """(sample name, position label or "") -> value."""
    return {(s.name, s.labels.get("position", "")): s.value
            for family in text_string_to_metric_families(metrics.render().decode())
            for s in family.samples if s.name.startswith("vllm:spec_decode")}


def test_spec_decode_counters_match_the_engine(nano: Path) -> None:
    spec = SpeculativeSettings(SpecMethod.DRAFT_MODEL, 3, draft_model=str(nano))  # draft == target: many accepts
    engine = LLMEngine(EngineConfig(model=str(nano), kv_cache_memory_bytes=4 << 20, speculative=spec))
    engine.generate([[5, 6, 7, 8, 9]] * 4, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    stats = engine.stats()
    metrics = RuntimeMetrics("nano", engine.max_model_len)
    metrics.record_step(stats, stepped=True)
    samples = _samples(metrics)
    assert samples[("vllm:spec_decode_num_drafts_total", "")] == stats.spec_num_drafts > 0
    assert samples[("vllm:spec_decode_num_draft_tokens_total", "")] == stats.spec_num_draft_tokens
    assert samples[("vllm:spec_decode_num_accepted_tokens_total", "")] == stats.spec_num_accepted_tokens > 0
    per_pos = [samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(p))] for p in range(3)]
    assert per_pos == stats.spec_num_accepted_tokens_per_pos
    assert sum(per_pos) == stats.spec_num_accepted_tokens
