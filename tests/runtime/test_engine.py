"""LLMEngine end to end on the tiny fp32 checkpoint: greedy outputs of 16 concurrent requests equal their
one-at-a-time outputs under continuous batching, chunked prefill, preemption and prefix-cache hits, and across a
mid-run reconfiguration. Also sampling, stop conditions, aborts and timestamps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, SchedulerKnobs
from gpu_runtime.engine.sampling import Sampler

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
NUM_REQUESTS = 16
SHARED_PREFIX_TEXT = "System: you are a helpful assistant that answers briefly and precisely. "


def _engine(path: Path, kv_bytes: int = 8 << 20, block_size: int = 16, **knobs: object) -> LLMEngine:
    config = EngineConfig(
        model=str(path), kv_cache_memory_bytes=kv_bytes, block_size=block_size, knobs=SchedulerKnobs(**knobs)
    )  # type: ignore[arg-type]
    return LLMEngine(config)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_runtime.checkpoint.builtin import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("engine_tiny"), preset="tiny")


@pytest.fixture(scope="module")
def prompts(tiny: Path) -> list[list[int]]:
    tok = _engine(tiny).tokenizer
    texts = [f"Request {i}: tell me about river number {i * 7}. " * (1 + i % 4) for i in range(NUM_REQUESTS)]
    return [tok.encode(SHARED_PREFIX_TEXT * 2 + t) if i % 2 else tok.encode(t) for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def reference(tiny: Path, prompts: list[list[int]]) -> list[list[int]]:
    """One request at a time, prefix caching off: nothing is batched or shared."""
    engine = _engine(tiny, enable_prefix_caching=False)
    return [engine.generate([p], GREEDY)[0] for p in prompts]


def _run_staggered(engine: LLMEngine, prompts: list[list[int]], per_step: int = 3) -> dict[str, list[int]]:
    """Add a few requests every step while earlier ones are mid-flight (continuous batching)."""
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished_requests():
        for i, prompt in pending[:per_step]:
            engine.add_request(f"r{i}", prompt, GREEDY)
        pending = pending[per_step:]
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    return outputs


def _as_list(outputs: dict[str, list[int]]) -> list[list[int]]:
    return [outputs[f"r{i}"] for i in range(len(outputs))]


def test_reference_is_not_degenerate(reference: list[list[int]]) -> None:
    assert all(len(r) == GREEDY.max_tokens for r in reference)
    assert len({tuple(r) for r in reference}) > NUM_REQUESTS // 2


def test_concurrent_equals_one_at_a_time(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = _engine(tiny, enable_prefix_caching=False)
    assert engine.generate(prompts, GREEDY) == reference
    assert engine.stats().num_preemptions == 0


def test_continuous_batching_with_staggered_arrivals(
    tiny: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = _engine(tiny, enable_prefix_caching=False)
    assert _as_list(_run_staggered(engine, prompts)) == reference


def test_chunked_prefill_small_token_budget(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = _engine(tiny, enable_prefix_caching=False, max_num_batched_tokens=24)
    seen_tokens: list[int] = []
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, GREEDY)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
        seen_tokens.append(engine.stats().last_step_num_tokens)
    assert _as_list(outputs) == reference
    assert max(seen_tokens) <= 24
    assert max(len(p) for p in prompts) > 24  # some prompt really was split across steps


def test_preemption_when_kv_pool_is_tiny(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    # Blocks of 4 tokens: every decoding sequence needs a new block every 4 steps, so a full pool must preempt.
    probe = _engine(tiny, block_size=4)
    bytes_per_block = (8 << 20) // probe.stats().num_total_blocks
    blocks_for_longest = probe.block_manager.blocks_needed(max(len(p) for p in prompts) + GREEDY.max_tokens)
    engine = _engine(
        tiny, kv_bytes=bytes_per_block * (blocks_for_longest + 4), block_size=4, enable_prefix_caching=False
    )
    assert engine.generate(prompts, GREEDY) == reference
    assert engine.stats().num_preemptions > 0
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_prefix_cache_hits_keep_outputs(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = _engine(tiny, enable_prefix_caching=True)
    outputs = _run_staggered(engine, prompts, per_step=1)
    assert _as_list(outputs) == reference
    stats = engine.stats()
    assert stats.prefix_cache_hits_tokens >= 16 * (NUM_REQUESTS // 2 - 1)  # shared system prompt: >= 1 block each
    assert stats.prefix_cache_queries_tokens == sum(len(p) for p in prompts)
    # The same prompt again hits all its full blocks except the last token's.
    again = engine.generate([prompts[1]], GREEDY)
    assert again == [reference[1]]
    hits = engine.stats().prefix_cache_hits_tokens - stats.prefix_cache_hits_tokens
    assert hits == (len(prompts[1]) - 1) // 16 * 16


def test_reconfigure_mid_run_loses_nothing(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = _engine(tiny, enable_prefix_caching=True)
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    finished: list[str] = []
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, GREEDY)
    plan = [
        SchedulerKnobs(max_num_seqs=3, max_num_batched_tokens=32, enable_prefix_caching=False),
        SchedulerKnobs(max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=False),
        SchedulerKnobs(),
    ]
    step = 0
    while engine.has_unfinished_requests():
        if step % 2 == 1 and plan:
            knobs = plan.pop(0)
            engine.reconfigure(knobs)
            assert engine.knobs == knobs
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finished:
                finished.append(out.request_id)
        step += 1
    assert not plan
    assert sorted(finished) == sorted(outputs)
    assert _as_list(outputs) == reference


def test_seeded_sampling_is_reproducible_across_batches(tiny: Path, prompts: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=123, ignore_eos=True)
    engine = _engine(tiny)
    alone = engine.generate([prompts[0]], params)
    together = engine.generate([prompts[0], prompts[3], prompts[5]], params)
    assert together[0] == alone[0]
    unseeded = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    assert len({tuple(t) for t in engine.generate([prompts[0]] * 4, unseeded)}) > 1


def _collect(engine: LLMEngine) -> list[RequestOutput]:
    events: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        events.extend(engine.step())
    return events


def test_stop_string_trims_text_and_finishes(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = _engine(tiny)
    full_text = engine.tokenizer.decode(reference[0])
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    engine.add_request("s", prompts[0], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, stop=(stop,)))
    events = _collect(engine)
    text = "".join(e.new_text for e in events)
    assert text == full_text[: full_text.index(stop)]
    assert events[-1].finished and events[-1].finish_reason == "stop"


def test_stop_token_and_length_reasons(tiny: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = _engine(tiny)
    engine.add_request(
        "t", prompts[0], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(reference[0][2],))
    )
    engine.add_request("l", prompts[1], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    events = {e.request_id: e for e in _collect(engine) if e.finished}
    assert (
        events["t"].finish_reason == "stop" and events["t"].num_output_tokens == reference[0].index(reference[0][2]) + 1
    )
    assert events["l"].finish_reason == "length" and events["l"].num_output_tokens == 3


def test_timestamps_are_ordered(tiny: Path, prompts: list[list[int]]) -> None:
    engine = _engine(tiny)
    engine.add_request("a", prompts[2], GREEDY)
    events = _collect(engine)
    last = events[-1]
    t = last.times
    assert t.arrival <= t.first_scheduled <= t.first_token <= t.last_token <= t.finished  # type: ignore[operator]
    token_times = [x for e in events for x in e.token_times]
    assert len(token_times) == GREEDY.max_tokens and token_times == sorted(token_times)
    assert token_times[0] == t.first_token and token_times[-1] == t.last_token


def test_abort_frees_blocks_and_reports(tiny: Path, prompts: list[list[int]]) -> None:
    engine = _engine(tiny)
    engine.add_request("x", prompts[0], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    engine.add_request("y", prompts[1], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    engine.step()
    assert engine.stats().num_free_blocks < engine.stats().num_total_blocks
    engine.abort_request("x")
    engine.abort_request("unknown")
    outs = engine.step()
    assert any(o.request_id == "x" and o.finished and o.finish_reason == "abort" for o in outs)
    engine.abort_request("y")
    engine.step()
    assert not engine.has_unfinished_requests()
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], GREEDY, "at least one token"),
        ([1, 2], SamplingParams(max_tokens=100_000), "max_model_len"),
        ([1, 10**9], GREEDY, "token ids"),
    ],
)
def test_bad_requests_are_refused(tiny: Path, prompt: list[int], params: SamplingParams, message: str) -> None:
    engine = _engine(tiny)
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, params)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "kwargs", [{"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -1}, {"stop": ("",)}]
)
def test_sampling_params_validate(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sampler_filters_and_distribution() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]] * 3)
    params = [
        SamplingParams(temperature=1.0, top_k=1),  # only the best token survives
        SamplingParams(temperature=1.0, top_p=0.01),  # nucleus of one token
        SamplingParams(temperature=0.0),  # greedy
    ]
    for _ in range(20):
        assert sampler.sample(logits, params, ["a", "b", "c"]) == [1, 1, 1]
    top2 = [SamplingParams(temperature=5.0, top_k=2)] * 200
    drawn = sampler.sample(torch.tensor([[0.0, 3.0, 2.9, -1.0]] * 200), top2, [f"r{i}" for i in range(200)])
    assert set(drawn) == {1, 2}  # hot temperature spreads over exactly the top two


def test_sampler_seed_gives_the_same_draws() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=1.0, seed=7)]
    first, second = Sampler(torch.device("cpu"), seed=1), Sampler(torch.device("cpu"), seed=2)
    draws = [first.sample(logits, params, ["x"])[0] for _ in range(10)]
    assert draws == [second.sample(logits, params, ["x"])[0] for _ in range(10)]
    assert len(set(draws)) > 1


def test_everything_at_once_preemption_chunking_prefix_hits(
    tiny: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """Small pool, small token budget, prefix caching on, staggered arrivals: still the one-at-a-time outputs."""
    probe = _engine(tiny, block_size=4)
    bytes_per_block = (8 << 20) // probe.stats().num_total_blocks
    blocks_for_longest = probe.block_manager.blocks_needed(max(len(p) for p in prompts) + GREEDY.max_tokens)
    engine = _engine(
        tiny,
        kv_bytes=bytes_per_block * (blocks_for_longest + 8),
        block_size=4,
        max_num_batched_tokens=40,
        max_num_seqs=6,
    )
    assert _as_list(_run_staggered(engine, prompts, per_step=2)) == reference
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits_tokens > 0
    assert stats.num_free_blocks == stats.num_total_blocks
