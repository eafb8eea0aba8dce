"""Speculative decoding inside LLMEngine: greedy output identical to non-speculative decoding for both methods, at
batch 1 and under continuous batching with 16 requests (chunked prefill, drafts cut by the token budget, preemption),
KV rolled back after rejections, acceptance on repetitive text and with draft == target, live switching, counters.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_runtime.checkpoint.builtin import build_checkpoint
from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams, SchedulerKnobs
from gpu_runtime.speculative.checkpoints import build_successor_model, build_truncated_draft, cycle_successor
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
NUM_REQUESTS = 16
MIN_ACCEPTANCE = 0.8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("spec_tiny") / "tiny", preset="tiny")


@pytest.fixture(scope="module")
def draft(tiny: Path) -> Path:
    return build_truncated_draft(tiny, tiny.parent / "draft", num_layers=2)


def _engine(
    path: Path, spec: SpeculativeSettings | None = None, kv_bytes: int = 8 << 20, **knobs: object
) -> LLMEngine:
    config = EngineConfig(model=str(path), kv_cache_memory_bytes=kv_bytes, knobs=SchedulerKnobs(**knobs),
                          speculative=spec)
    return LLMEngine(config)


@pytest.fixture(scope="module")
def prompts(tiny: Path) -> list[list[int]]:
    tok = _engine(tiny).tokenizer
    # Repeated phrases give prompt lookup something to find; lengths vary so prefill chunks mix with decodes.
    texts = [f"Request {i}: tell me about river number {i * 7}. " * (1 + i % 4) for i in range(NUM_REQUESTS)]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def reference(tiny: Path, prompts: list[list[int]]) -> list[list[int]]:
    return _engine(tiny).generate(prompts, GREEDY)


def _settings(method: str, tiny: Path, draft: Path) -> SpeculativeSettings:
    if method == "ngram":
        return SpeculativeSettings(SpecMethod.NGRAM, num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    target_as_draft = method == "draft_is_target"
    return SpeculativeSettings(SpecMethod.DRAFT_MODEL, 3, draft_model=str(tiny if target_as_draft else draft))


METHODS = ["ngram", "draft_model", "draft_is_target"]


@pytest.mark.parametrize("method", METHODS)
def test_greedy_output_is_identical_at_batch_one(
    method: str, tiny: Path, draft: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = _engine(tiny, _settings(method, tiny, draft))
    assert [engine.generate([p], GREEDY)[0] for p in prompts[:4]] == reference[:4]
    stats = engine.stats()
    assert stats.spec_num_drafts > 0 and stats.spec_num_draft_tokens >= stats.spec_num_drafts


@pytest.mark.parametrize("method", METHODS)
def test_greedy_output_is_identical_under_continuous_batching(
    method: str, tiny: Path, draft: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    # A 40-token budget chunks the prompts and cuts drafts short while others prefill.
    engine = _engine(tiny, _settings(method, tiny, draft), max_num_batched_tokens=40)
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(NUM_REQUESTS)}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished_requests():
        for i, prompt in pending[:3]:  # staggered arrivals: new requests join mid-flight
            engine.add_request(f"r{i}", prompt, GREEDY)
        pending = pending[3:]
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    assert [outputs[f"r{i}"] for i in range(NUM_REQUESTS)] == reference
    stats = engine.stats()
    assert stats.spec_num_draft_tokens > 0
    assert stats.num_free_blocks == stats.num_total_blocks  # every draft block was returned


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_output_is_identical_under_preemption(
    method: str, tiny: Path, draft: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = _engine(tiny, _settings(method, tiny, draft), kv_bytes=48 * 16 * 4 * 4 * 32 * 2 * 4)
    assert engine.stats().num_total_blocks == 48
    assert engine.generate(prompts, GREEDY) == reference
    assert engine.stats().num_preemptions > 0


def test_rejected_drafts_give_their_blocks_back(tiny: Path, prompts: list[list[int]]) -> None:
    spec = SpeculativeSettings(SpecMethod.NGRAM, 8, 1, 1)
    engine = LLMEngine(EngineConfig(model=str(tiny), kv_cache_memory_bytes=8 << 20, block_size=4, speculative=spec))
    engine.add_request("r", prompts[3], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        held = engine.stats().num_total_blocks - engine.stats().num_free_blocks
        seq_tokens = sum(len(s.token_ids) for s in engine.scheduler.running)
        # After each step a running sequence holds blocks for its computed tokens only, not its rejected drafts.
        assert held <= -(-seq_tokens // 4)
    stats = engine.stats()
    assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # some drafts really were rejected


def test_ngram_acceptance_on_a_prompt_whose_continuation_repeats_it(tiny: Path) -> None:
    cycle = list(range(300, 340))
    model = build_successor_model(tiny, tiny.parent / "successor", cycle_successor(2048, cycle))
    engine = _engine(model, SpeculativeSettings(SpecMethod.NGRAM, 4, 1, 3))
    prompt = cycle * 2
    out = engine.generate([prompt], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))[0]
    assert out == (cycle * 3)[: len(out)]  # the continuation repeats the prompt
    stats = engine.stats()
    assert stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens > MIN_ACCEPTANCE
    assert stats.spec_num_accepted_tokens_per_pos[0] >= stats.spec_num_accepted_tokens_per_pos[-1] > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_equal_to_target_is_accepted(tiny: Path, prompts: list[list[int]], temperature: float) -> None:
    # With q == p the acceptance probability min(1, p/q) is 1 (up to float rounding between the two forward
    # shapes), so a mismatch here means the engine gives the verifier the wrong distributions.
    engine = _engine(tiny, SpeculativeSettings(SpecMethod.DRAFT_MODEL, 4, draft_model=str(tiny)))
    params = SamplingParams(max_tokens=16, temperature=temperature, top_k=50, seed=7, ignore_eos=True)
    outputs = engine.generate(prompts[:8], params)
    assert all(len(o) == params.max_tokens for o in outputs)
    stats = engine.stats()
    assert stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens > MIN_ACCEPTANCE


def test_stop_tokens_inside_accepted_drafts_end_the_request(tiny: Path) -> None:
    cycle = list(range(300, 340))
    model = build_successor_model(tiny, tiny.parent / "successor_stop", cycle_successor(2048, cycle))
    engine = _engine(model, SpeculativeSettings(SpecMethod.NGRAM, 4, 1, 3))
    params = SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(305,))
    out = engine.generate([cycle * 2], params)[0]
    assert out == [300, 301, 302, 303, 304, 305]


def test_switching_live_keeps_requests_in_flight(
    tiny: Path, draft: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = _engine(tiny)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY)
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(NUM_REQUESTS)}
    switches = iter([_settings("ngram", tiny, draft), _settings("draft_model", tiny, draft), None,
                     '{"method":"ngram","num_speculative_tokens":2}'])
    while engine.has_unfinished_requests():
        engine.set_speculative(next(switches, None))
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    assert [outputs[f"r{i}"] for i in range(NUM_REQUESTS)] == reference


def test_bad_speculative_config_keeps_the_current_one(tiny: Path, draft: Path) -> None:
    engine = _engine(tiny, _settings("ngram", tiny, draft))
    with pytest.raises(ValueError, match="unsupported speculative method"):
        engine.set_speculative({"method": "eagle"})
    with pytest.raises(ValueError, match=r"draft model: .*does not exist"):
        engine.set_speculative({"method": "draft_model", "model": str(tiny.parent / "missing")})
    assert engine.speculative == _settings("ngram", tiny, draft)


def test_seeded_sampling_with_prompt_lookup_does_not_depend_on_the_batch(
    tiny: Path, prompts: list[list[int]]
) -> None:
    spec = SpeculativeSettings(SpecMethod.NGRAM, 4, 1, 2)
    # A prompt holding half the vocabulary: most sampled tokens occurred before, so lookup drafts nearly every step.
    long_prompt = list(range(2, 1002))
    seeded = SamplingParams(max_tokens=24, temperature=0.8, seed=11, ignore_eos=True)
    others = SamplingParams(max_tokens=24, temperature=0.8, ignore_eos=True)
    alone = _engine(tiny, spec)
    alone.add_request("seeded", long_prompt, seeded)
    batched = _engine(tiny, spec)
    batched.add_request("seeded", long_prompt, seeded)
    for i in range(8):
        batched.add_request(f"other{i}", prompts[i], others)
    results = []
    for engine in (alone, batched):
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            tokens += [t for out in engine.step() if out.request_id == "seeded" for t in out.new_token_ids]
        results.append(tokens)
        assert engine.stats().spec_num_drafts >= 10
    assert results[0] == results[1]
