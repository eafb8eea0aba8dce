"""Request validation, SSE framing and chat templating: the server layers that need no engine."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpu_runtime.checkpoint.builtin import CHAT_TEMPLATE
from gpu_runtime.server.chat import ChatTemplate
from gpu_runtime.server.protocol import APIError, ChatCompletionRequest, ChatMessage, CompletionRequest
from gpu_runtime.server.streaming import DONE_EVENT, ChunkEncoder, StreamKind


def _events(raw: bytes) -> list[str]:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return [chunk.removeprefix("data: ") for chunk in raw.decode().split("\n\n") if chunk]


@pytest.mark.parametrize("prompt, expected", [("hi", "hi"), (["hi"], "hi"), ([1, 2, 3], [1, 2, 3]), ([[4, 5]], [4, 5])])
def test_completion_prompt_forms(prompt: object, expected: object) -> None:
    assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompt == expected


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", 2.5), ("top_p", 0.0), ("top_p", 1.5), ("max_tokens", 0), ("n", 2),
    ("top_k", -2), ("prompt", ""), ("prompt", ["a", "b"]), ("stop", ["x"] * 17), ("stop", [""]),
    ("logprobs", 21), ("logprobs", -1), ("logprobs", True),
    ("presence_penalty", 0.5), ("echo", True), ("min_tokens", -1), ("logit_bias", {"x": 1}),
    ("logit_bias", {"5": -101}),
])
def test_completion_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "hi"} | {field: value})


def test_unknown_fields_are_ignored_and_usage_option_read() -> None:
    request = CompletionRequest.model_validate(
        {"model": "m", "prompt": "hi", "user": "x", "stream": True, "stream_options": {"include_usage": True},
         "stop": "\n"})
    assert request.include_usage and request.stop_strings == ("\n",)


def test_chat_request_needs_messages_and_reads_content_parts() -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": []})
    request = ChatCompletionRequest.model_validate({"model": "m", "max_completion_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert request.messages[0].text() == "ab" and request.output_limit == 5


def test_completion_chunks_are_valid_json_events() -> None:
    encoder = ChunkEncoder("cmpl-1", "tiny", StreamKind.COMPLETION)
    [event] = _events(encoder.text('say "hi"\n', None))
    chunk = json.loads(event)
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == 'say "hi"\n'
    assert chunk["choices"][0]["finish_reason"] is None and chunk["model"] == "tiny" and chunk["id"] == "cmpl-1"
    assert json.loads(_events(encoder.text("", "length"))[0])["choices"][0]["finish_reason"] == "length"
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_chat_chunks_role_delta_and_usage() -> None:
    encoder = ChunkEncoder("chatcmpl-1", "tiny", StreamKind.CHAT)
    role = json.loads(_events(encoder.role())[0])
    assert role["object"] == "chat.completion.chunk" and role["choices"][0]["delta"]["role"] == "assistant"
    delta = json.loads(_events(encoder.text("é", "stop"))[0])["choices"][0]
    assert delta["delta"] == {"content": "é"} and delta["finish_reason"] == "stop"
    usage = json.loads(_events(encoder.usage(7, 3))[0])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                                         "total_tokens": 10}


def test_chat_template_from_checkpoint_config(tmp_path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    template = ChatTemplate.from_model(tmp_path)
    assert template.bos_token == "<s>"
    text = template.render([ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")])
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_fallback_and_errors(tmp_path) -> None:
    plain = ChatTemplate.from_model(tmp_path)  # no tokenizer_config.json
    assert plain.render([ChatMessage(role="user", content="hi")]) == "user: hi\nassistant:"
    failing = ChatTemplate(source="{{ raise_exception('only user turns') }}")
    with pytest.raises(APIError) as refused:
        failing.render([ChatMessage(role="user", content="hi")])
    assert refused.value.status == 400 and "only user turns" in refused.value.message
    sandboxed = ChatTemplate(source="{{ messages.__class__.__mro__ }}")
    with pytest.raises(APIError):
        sandboxed.render([ChatMessage(role="user", content="hi")])
