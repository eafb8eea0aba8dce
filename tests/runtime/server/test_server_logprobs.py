"""OpenAI `logprobs` through the real `openai` SDK against real server processes: the completions and chat shapes,
streamed equal to not streamed, values equal to log_softmax of the model's logits, and the same numbers when requests
are batched together or served by a runtime with chunked prefill and n-gram speculation on."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from tests.harness.runtime import RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME

PROMPTS = ["The quick brown fox", "Once upon a time there was a small model that wanted to write stories about "
           "rivers, mountains and old cities, and it", "Questions and answers: What is the capital of France?",
           "river city river city river city river city river"]  # repeats: prompt lookup finds drafts
NUM_TOKENS = 16
ATOL = 1e-4


def _client(server: RuntimeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(client: openai.OpenAI, prompt: str, **kwargs: object):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=NUM_TOKENS, temperature=0,
                                     logprobs=3, extra_body={"ignore_eos": True}, **kwargs)


@pytest.fixture(scope="module")
def client(server: RuntimeServer) -> openai.OpenAI:
    return _client(server)


@pytest.fixture(scope="module")
def alone(client: openai.OpenAI) -> list:
    return [_complete(client, p).choices[0].logprobs for p in PROMPTS]


def test_completion_logprobs_equal_the_model_log_softmax(tiny_checkpoint: Path, alone: list) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_checkpoint), dtype="float32", device="cpu"))
    prompt = engine.tokenizer.encode(PROMPTS[0])
    [tokens] = engine.generate([prompt], SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True))
    runner = ModelRunner(tiny_checkpoint, torch.float32, torch.device("cpu"), 128, 16, num_blocks=8)
    ids = prompt + tokens[:-1]
    logprobs = runner.execute([SequenceInput(ids, 0, list(range(8)), len(tokens))]).log_softmax(-1)
    expected = logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    got = alone[0]
    assert got.tokens == [engine.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    assert got.token_logprobs == pytest.approx(expected, abs=ATOL)
    for token, value, top in zip(got.tokens, got.token_logprobs, got.top_logprobs, strict=True):
        assert top[token] == value == max(top.values()) and len(top) <= 4  # greedy: the sampled token leads
    assert got.text_offset == [sum(len(t) for t in got.tokens[:i]) for i in range(NUM_TOKENS)]


def test_streamed_logprobs_equal_the_whole_response(client: openai.OpenAI, alone: list) -> None:
    chunks = [c.choices[0] for c in _complete(client, PROMPTS[1], stream=True)]
    streamed = [c.logprobs for c in chunks if c.logprobs is not None]
    assert sum(len(lp.tokens) for lp in streamed) == NUM_TOKENS
    assert [t for lp in streamed for t in lp.tokens] == alone[1].tokens
    assert [v for lp in streamed for v in lp.token_logprobs] == pytest.approx(alone[1].token_logprobs, abs=ATOL)
    assert [o for lp in streamed for o in lp.text_offset] == alone[1].text_offset


def test_chat_logprobs_shape(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 5,
              "temperature": 0, "logprobs": True, "top_logprobs": 2, "extra_body": {"ignore_eos": True}}
    content = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.bytes == list(entry.token.encode()) and math.isfinite(entry.logprob)
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    streamed = [c.choices[0].logprobs for c in client.chat.completions.create(**kwargs, stream=True)
                if c.choices and c.choices[0].logprobs is not None]
    assert [e.token for lp in streamed for e in lp.content] == [e.token for e in content]
    without = client.chat.completions.create(**{**kwargs, "logprobs": False, "top_logprobs": None})
    assert without.choices[0].logprobs is None


def _same(got: list, expected: list) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.tokens == e.tokens
        assert g.token_logprobs == pytest.approx(e.token_logprobs, abs=ATOL)
        assert [sorted(t) for t in g.top_logprobs] == [sorted(t) for t in e.top_logprobs]


def test_batched_requests_get_the_same_logprobs(client: openai.OpenAI, alone: list) -> None:
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        together = list(pool.map(lambda p: _complete(client, p).choices[0].logprobs, PROMPTS * 2))
    _same(together, alone * 2)


def test_chunked_prefill_and_speculation_keep_logprobs(start_server: Callable[..., RuntimeServer],
                                                       alone: list) -> None:
    server = start_server("--max-num-batched-tokens", "16", "--speculative-config",
                          '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":2}')
    client = _client(server)
    _same([_complete(client, p).choices[0].logprobs for p in PROMPTS], alone)
    assert server.metric("vllm:spec_decode_num_draft_tokens_total") > 0


@pytest.mark.parametrize("body", [{"logprobs": 21}, {"logprobs": True}])
def test_bad_completion_logprobs_are_400(client: openai.OpenAI, body: dict[str, object]) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, extra_body=body)


def test_top_logprobs_without_logprobs_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, top_logprobs=2)
