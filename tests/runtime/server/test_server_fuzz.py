"""Property-based fuzzing of the HTTP API: whatever a client sends, the answer is never a 5xx and the server lives.

Bodies mix valid requests with wrong types, out-of-range sampling values, unknown models, odd prompts (token ids
outside the vocabulary, huge max_tokens) and non-JSON bytes. Generation lengths stay small so the run stays fast.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.runtime import RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
maybe = lambda strategy: st.one_of(strategy, json_values)  # noqa: E731 - a valid value or any JSON at all

sampling = st.fixed_dictionaries({
    "model": st.one_of(st.just(MODEL_NAME), json_values),
    "max_tokens": st.one_of(st.integers(-2, 6), st.just(10**9), st.text(max_size=3), st.floats(-1, 5, allow_nan=False)),
}, optional={
    "temperature": maybe(st.floats(-1, 3, allow_nan=False, allow_infinity=False)),
    "top_p": maybe(st.floats(-0.5, 1.5, allow_nan=False, allow_infinity=False)),
    "top_k": maybe(st.integers(-3, 50)),
    "seed": maybe(st.integers(-(2**63), 2**64)),
    "stop": maybe(st.lists(st.text(max_size=4), max_size=3)),
    "stop_token_ids": maybe(st.lists(st.integers(-5, 5000), max_size=3)),
    "stream": st.booleans(),
    "stream_options": maybe(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "n": maybe(st.integers(0, 3)),
    "ignore_eos": st.booleans(),
    "logprobs": json_values,
})
prompts = st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 5000), max_size=8),
                    st.lists(st.text(max_size=10), max_size=2), json_values)
messages = st.lists(st.fixed_dictionaries({
    "role": st.one_of(st.sampled_from(["system", "user", "assistant", "robot"]), json_values),
    "content": st.one_of(st.text(max_size=30), json_values)}), max_size=3) | json_values
completion_bodies = st.builds(lambda s, p: s | {"prompt": p}, sampling, prompts)
chat_bodies = st.builds(lambda s, m: s | {"messages": m}, sampling, messages)


@pytest.fixture(scope="module")
def http(server: RuntimeServer):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]["message"]


fuzz_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                         derandomize=True)


@fuzz_settings
@given(body=completion_bodies)
def test_fuzz_completions(http: httpx.Client, body: dict) -> None:
    _check(http.post("/v1/completions", json=body))


@fuzz_settings
@given(body=chat_bodies)
def test_fuzz_chat(http: httpx.Client, body: dict) -> None:
    _check(http.post("/v1/chat/completions", json=body))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(raw=st.binary(max_size=64), path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/admin/config"]))
def test_fuzz_raw_bytes(http: httpx.Client, raw: bytes, path: str) -> None:
    _check(http.post(path, content=raw, headers={"content-type": "application/json"}))


def test_server_alive_after_fuzzing(server: RuntimeServer, http: httpx.Client) -> None:
    assert server.alive()
    ok = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "still there?", "max_tokens": 2})
    assert ok.status_code == 200
