"""The real `openai` SDK against a real server process: completions and chat, streamed and not, usage, errors."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.harness.runtime import RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME


@pytest.fixture(scope="module")
def client(server: RuntimeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    [model] = client.models.list().data
    assert model.id == MODEL_NAME and model.object == "model"
    assert model.model_extra["max_model_len"] > 0


def test_completion_non_streaming_counts_tokens(client: openai.OpenAI) -> None:
    result = client.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    [choice] = result.choices
    assert choice.finish_reason == "length" and choice.text
    assert result.usage.completion_tokens == 6 and result.usage.prompt_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens + 6


def test_completion_streaming_equals_non_streaming_greedy(client: openai.OpenAI) -> None:
    kwargs = {
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 8
    text_chunks = chunks[:-1]
    assert "".join(c.choices[0].text for c in text_chunks) == whole
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])


def test_streaming_without_usage_option_sends_no_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=3, stream=True))
    assert chunks and all(c.usage is None and len(c.choices) == 1 for c in chunks)


def test_chat_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "You answer."}, {"role": "user", "content": "What is the capital?"}]
    kwargs = {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": 7,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.chat.completions.create(**kwargs)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == 7 and whole.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    kwargs = {
        "model": MODEL_NAME,
        "prompt": "Numbers: 1 2 3",
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 11,
        "extra_body": {"ignore_eos": True},
    }
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


def test_sdk_sees_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=1_000_000)
    assert "context length" in too_long.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], top_p=0)


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{not json", 400),
        (b"[]", 400),
        (b'{"model": "tiny"}', 400),
        (b'{"model":"tiny","prompt":"x","n":3}', 400),
        (b'{"model":"tiny","prompt":[999999],"max_tokens":2}', 400),
        (b'{"model":"tiny","prompt":"x","temperature":NaN}', 400),
    ],
)
def test_malformed_requests_get_openai_error_objects(server: RuntimeServer, body: bytes, status: int) -> None:
    response = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"]
    assert server.alive()


def test_unknown_route_is_an_openai_404(server: RuntimeServer) -> None:
    response = httpx.get(f"{server.url}/v1/nothing")
    assert response.status_code == 404 and "error" in response.json()


def test_min_tokens_and_logit_bias_reach_the_engine(client: openai.OpenAI, tiny_checkpoint: Path) -> None:
    # EOS biased up ends a request at once, unless min_tokens holds it.
    eos = json.loads((tiny_checkpoint / "config.json").read_text())["eos_token_id"]
    eos_first = {"logit_bias": {str(eos): 100}}
    ended = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=8, temperature=0, **eos_first)
    assert ended.usage.completion_tokens == 1 and ended.choices[0].finish_reason == "stop"
    held = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=8, temperature=0,
                                     extra_body={"min_tokens": 5}, **eos_first)
    assert held.usage.completion_tokens >= 5
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                          max_tokens=8, temperature=0, extra_body={"min_tokens": 8}, **eos_first)
    assert chat.usage.completion_tokens == 8 and chat.choices[0].finish_reason == "length"


@pytest.mark.parametrize("kwargs, words", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tool calling"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"extra_body": {"min_tokens": 9}, "max_tokens": 4}, "min_tokens"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 150}}, "logit_bias"),
])
def test_what_the_runtime_cannot_honour_is_refused_not_dropped(
    client: openai.OpenAI, kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                       **{"max_tokens": 4} | kwargs)  # type: ignore[arg-type]
    assert words in refused.value.message


def test_tools_with_tool_choice_none_and_text_format_are_served(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=3, response_format={"type": "text"},
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], tool_choice="none")
    assert reply.usage.completion_tokens >= 1


def test_a_reply_can_continue_the_final_message(client: openai.OpenAI) -> None:
    user = [{"role": "user", "content": "x"}]
    fresh = client.chat.completions.create(model=MODEL_NAME, messages=user, max_tokens=1)
    continued = client.chat.completions.create(
        model=MODEL_NAME, messages=[*user, {"role": "assistant", "content": "Sure"}], max_tokens=1,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    # The same prompt up to the assistant header, then the reply's start with no end-of-turn after it.
    assert fresh.usage.prompt_tokens < continued.usage.prompt_tokens <= fresh.usage.prompt_tokens + 4
    with pytest.raises(openai.BadRequestError, match="cannot both"):
        client.chat.completions.create(model=MODEL_NAME, messages=user, max_tokens=1,
                                       extra_body={"continue_final_message": True})
