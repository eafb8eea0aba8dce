"""Logprobs of generated tokens: each equals log_softmax of the model's raw logits at its position (scored here by
one unbatched forward pass over the whole sequence), its top alternatives are that row's top-k, and the numbers stay
the same when the request is batched with others, its prompt is prefilled in chunks, or speculation verifies it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, SchedulerKnobs
from gpu_runtime.engine.logprobs import TokenLogprob
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.speculative.checkpoints import build_successor_model, cycle_successor
from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=3)
NGRAM = SpeculativeSettings(SpecMethod.NGRAM, num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
ATOL, RTOL = 2e-5, 1e-6  # fp32 rounding between differently shaped forward passes


def _engine(model: Path, spec: SpeculativeSettings | None = None, **knobs: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), device="cpu", dtype="float32", kv_cache_memory_bytes=4 << 20,
                                  knobs=SchedulerKnobs(**knobs), speculative=spec))


def _run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[tuple[list[int], list]]:
    """(tokens, logprobs) of each prompt, all submitted at once."""
    results: dict[str, tuple[list[int], list[TokenLogprob]]] = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
        results[f"r{i}"] = ([], [])
    while engine.has_unfinished_requests():
        for out in engine.step():
            _collect(results[out.request_id], out)
    return [results[f"r{i}"] for i in range(len(prompts))]


def _collect(result: tuple[list[int], list[TokenLogprob]], out: RequestOutput) -> None:
    assert out.logprobs is not None and len(out.logprobs) == len(out.new_token_ids)
    assert [lp.token_id for lp in out.logprobs] == out.new_token_ids
    result[0].extend(out.new_token_ids)
    result[1].extend(out.logprobs)


def _reference(model: Path, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax rows [len(tokens), V] that scored each token, from one forward pass over the whole sequence."""
    runner = ModelRunner(model, torch.float32, torch.device("cpu"), 256, 16, num_blocks=16)
    ids = prompt + tokens[:-1]
    logits = runner.execute([SequenceInput(ids, 0, list(range(16)), num_logits=len(tokens))])
    return logits.log_softmax(dim=-1)


def _values(logprobs: list[TokenLogprob]) -> torch.Tensor:
    return torch.tensor([[lp.logprob, *(v for _, v in lp.top)] for lp in logprobs])


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [[(7 * i + 3 * j) % 500 + 5 for j in range(4 + 11 * i)] for i in range(5)]  # up to 48 tokens


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_raw_log_softmax(nano_llama: Path, prompts: list[list[int]], temperature: float) -> None:
    params = SamplingParams(max_tokens=8, temperature=temperature, seed=3, ignore_eos=True, logprobs=4)
    [(tokens, logprobs)] = _run(_engine(nano_llama), prompts[2:3], params)
    reference = _reference(nano_llama, prompts[2], tokens)
    chosen = reference.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([lp.logprob for lp in logprobs]), chosen, rtol=RTOL, atol=ATOL)
    top_values, top_ids = reference.topk(4, dim=-1)
    assert [[t for t, _ in lp.top] for lp in logprobs] == top_ids.tolist()
    torch.testing.assert_close(torch.tensor([[v for _, v in lp.top] for lp in logprobs]), top_values, rtol=RTOL,
                               atol=ATOL)
    if temperature == 0.0:  # greedy: the emitted token is the most likely one
        assert all(lp.top[0][0] == lp.token_id for lp in logprobs)


def test_batched_and_chunked_equal_alone(nano_llama: Path, prompts: list[list[int]]) -> None:
    alone = [_run(_engine(nano_llama), [p], GREEDY)[0] for p in prompts]
    together = _run(_engine(nano_llama, max_num_seqs=8), prompts, GREEDY)
    chunked = _run(_engine(nano_llama, max_num_batched_tokens=16), prompts, GREEDY)
    for (tokens, logprobs), (t2, l2), (t3, l3) in zip(alone, together, chunked, strict=True):
        assert tokens == t2 == t3
        torch.testing.assert_close(_values(l2), _values(logprobs), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(_values(l3), _values(logprobs), rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def repetitive(nano_llama: Path) -> Path:
    """Greedy output repeats the prompt's cycle, so n-gram drafts are accepted and verified rows emit tokens."""
    return build_successor_model(nano_llama, nano_llama.parent / "logprob_successor",
                                 cycle_successor(512, list(range(300, 330))))


@pytest.mark.parametrize("which", ["random_model", "repetitive_model"])
def test_speculation_keeps_logprobs(nano_llama: Path, repetitive: Path, prompts: list[list[int]], which: str) -> None:
    model, batch = (nano_llama, prompts) if which == "random_model" else (repetitive, [list(range(300, 330)) * 2])
    plain = _run(_engine(model), batch, GREEDY)
    engine = _engine(model, NGRAM)
    speculated = _run(engine, batch, GREEDY)
    assert engine.stats().spec_num_draft_tokens > 0
    if which == "repetitive_model":
        assert engine.stats().spec_num_accepted_tokens > 0
    for (tokens, logprobs), (t2, l2) in zip(plain, speculated, strict=True):
        assert tokens == t2
        torch.testing.assert_close(_values(l2), _values(logprobs), rtol=RTOL, atol=ATOL)


def test_a_stop_cuts_logprobs_with_the_tokens(nano_llama: Path, prompts: list[list[int]]) -> None:
    [(tokens, _)] = _run(_engine(nano_llama), prompts[:1], GREEDY)
    stopping = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0, stop_token_ids=(tokens[3],))
    [(cut, logprobs)] = _run(_engine(nano_llama), prompts[:1], stopping)
    assert cut == tokens[: tokens.index(tokens[3]) + 1] and len(logprobs) == len(cut)
    assert all(lp.top == () for lp in logprobs)


def test_requests_without_logprobs_get_none(nano_llama: Path, prompts: list[list[int]]) -> None:
    engine = _engine(nano_llama)
    engine.add_request("plain", prompts[0], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    engine.add_request("asks", prompts[1], GREEDY)
    seen = {"plain": [], "asks": []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out.logprobs)
    assert all(lp is None for lp in seen["plain"]) and all(lp for lp in seen["asks"])
