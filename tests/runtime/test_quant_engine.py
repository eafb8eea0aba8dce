"""Quantization switched live in LLMEngine: re-quantized from the checkpoint in process, weight memory reported,
requests in flight kept, "none" restores the exact full-precision outputs, fp8 refused on CPU without harm."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.quant import Fp8UnsupportedError, Int8Linear, QuantScheme

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
MAX_WEIGHT_RATIO = 0.55


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("quant_engine") / "tiny", preset="tiny")


def _engine(path: Path, quantization: str = "none") -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=8 << 20, quantization=quantization))


@pytest.fixture(scope="module")
def prompts(tiny: Path) -> list[list[int]]:
    tok = _engine(tiny).tokenizer
    return [tok.encode(f"Question {i}: what is the capital of country number {i}?") for i in range(16)]


def test_int8_switch_reports_memory_and_none_restores_full_precision(tiny: Path, prompts: list[list[int]]) -> None:
    engine = _engine(tiny)
    full = engine.generate(prompts, GREEDY)
    to_int8 = engine.set_quantization("int8")
    assert to_int8.scheme is QuantScheme.INT8 and engine.quantization == "int8"
    assert to_int8.weight_bytes_after <= MAX_WEIGHT_RATIO * to_int8.weight_bytes_before
    assert isinstance(engine.runner.model.layers[0].self_attn.qkv_proj, Int8Linear)
    quantized = engine.generate(prompts, GREEDY)
    assert quantized != full  # the weights really changed ...
    # ... but not the model: first tokens mostly agree (random weights have tiny top-2 margins, see test_quant.py;
    # a broken int8 path agrees on ~1/vocab of them).
    assert sum(q[0] == f[0] for q, f in zip(quantized, full, strict=True)) >= 0.75 * len(prompts)
    again = engine.set_quantization("int8")
    assert again.weight_bytes_before == again.weight_bytes_after == to_int8.weight_bytes_after
    assert engine.generate(prompts, GREEDY) == quantized  # re-quantized from the checkpoint, not twice rounded
    back = engine.set_quantization("none")
    assert back.weight_bytes_after == to_int8.weight_bytes_before
    assert engine.generate(prompts, GREEDY) == full


def test_quantization_at_start_equals_switching_live(tiny: Path, prompts: list[list[int]]) -> None:
    live = _engine(tiny)
    live.set_quantization("int8")
    assert _engine(tiny, "int8").generate(prompts, GREEDY) == live.generate(prompts, GREEDY)


def test_switching_mid_flight_loses_no_request(tiny: Path, prompts: list[list[int]]) -> None:
    engine = _engine(tiny)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY)
    counts = dict.fromkeys((f"r{i}" for i in range(len(prompts))), 0)
    schemes = iter(["int8", "none", "int8"])
    while engine.has_unfinished_requests():
        for out in engine.step():
            counts[out.request_id] += len(out.new_token_ids)
        scheme = next(schemes, None)
        if scheme:
            engine.set_quantization(scheme)
    assert set(counts.values()) == {GREEDY.max_tokens}


def test_fp8_on_cpu_is_refused_and_the_engine_keeps_serving(tiny: Path, prompts: list[list[int]]) -> None:
    engine = _engine(tiny)
    engine.set_quantization("int8")
    expected = engine.generate(prompts[:4], GREEDY)
    with pytest.raises(Fp8UnsupportedError, match="CUDA"):
        engine.set_quantization("fp8")
    with pytest.raises(ValueError, match="unsupported quantization"):
        engine.set_quantization("awq")
    assert engine.quantization == "int8"
    assert engine.generate(prompts[:4], GREEDY) == expected
    with pytest.raises(ValueError, match="CUDA"):
        _engine(tiny, "fp8")
