"""Live reconfiguration through /admin/config, its guard, and overload answers (429 with Retry-After)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from slotune.knobs import RuntimeConfig
from tests.harness.runtime import ADMIN_TOKEN, RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def admin_server(start_server: Callable[..., RuntimeServer]) -> RuntimeServer:
    return start_server("--max-num-seqs", "8", "--max-num-batched-tokens", "512")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN},
                                     {"X-Slotune-Admin-Token": "wrong"}, {"X-Slotune-Admin-Token": ""}])
def test_admin_needs_the_bearer_token(admin_server: RuntimeServer, headers: dict[str, str]) -> None:
    for method in ("GET", "POST"):
        response = httpx.request(method, f"{admin_server.url}/admin/config", headers=headers, json={"max_num_seqs": 1})
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


def test_token_header_that_survives_the_api_server_pod_proxy(admin_server: RuntimeServer) -> None:
    # kube-apiserver consumes Authorization to authenticate the operator and drops it before proxying to the pod.
    response = httpx.get(f"{admin_server.url}/admin/config", headers={"X-Slotune-Admin-Token": ADMIN_TOKEN})
    assert response.status_code == 200 and "max_num_seqs" in response.json()


def test_get_returns_the_operator_payload_shape(admin_server: RuntimeServer) -> None:
    live = httpx.get(f"{admin_server.url}/admin/config", headers=AUTH).json()
    expected = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=512).admin_payload()
    assert {k: live[k] for k in expected} == expected


@pytest.mark.parametrize("body", [
    {"max_num_seqs": 0}, {"max_num_seqs": "4"}, {"enable_prefix_caching": "yes"}, {"max_num_batched_tokens": -1},
    {"no_such_knob": 1}, {"quantization": "awq"}, [1, 2],
])
def test_invalid_values_are_refused_and_change_nothing(admin_server: RuntimeServer, body: object) -> None:
    before = httpx.get(f"{admin_server.url}/admin/config", headers=AUTH).json()
    response = httpx.post(f"{admin_server.url}/admin/config", headers=AUTH, json=body)
    assert response.status_code == 400 and response.json()["error"]["message"]
    assert httpx.get(f"{admin_server.url}/admin/config", headers=AUTH).json() == before


def test_restating_the_full_payload_is_accepted(admin_server: RuntimeServer) -> None:
    payload = RuntimeConfig(max_num_seqs=8, max_num_batched_tokens=512).admin_payload()
    response = httpx.post(f"{admin_server.url}/admin/config", headers=AUTH, json=payload)
    assert response.status_code == 200 and response.json() == payload


def test_live_reconfiguration_under_load_fails_no_request(admin_server: RuntimeServer) -> None:
    num_clients, new_limit = 12, 2
    results = asyncio.run(_load_while_reconfiguring(admin_server, num_clients, new_limit))
    running_before, running_after, statuses, config = results
    assert max(running_before) > new_limit  # the old limit let more run
    assert set(statuses) == {200}, statuses  # zero failed requests, before, during and after the change
    assert config["max_num_seqs"] == new_limit and config["enable_prefix_caching"] is False
    settled = running_after[-15:]  # requests running at the change may finish under the old limit
    assert max(settled) <= new_limit and new_limit in settled, running_after
    labels = admin_server.metric_labels("vllm:cache_config_info")
    assert labels["max_num_seqs"] == str(new_limit) and labels["enable_prefix_caching"] == "false"


async def _load_while_reconfiguring(server: RuntimeServer, num_clients: int, new_limit: int):
    stop = asyncio.Event()
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        async def client_loop(index: int) -> None:
            while not stop.is_set():
                body = {"model": MODEL_NAME, "prompt": f"client {index}", "max_tokens": 24, "ignore_eos": True,
                        "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass
                    statuses.append(response.status_code)

        async def sample_running(count: int) -> list[float]:
            values = []
            for _ in range(count):
                values.append(await asyncio.to_thread(server.metric, "vllm:num_requests_running"))
                await asyncio.sleep(0.05)
            return values

        clients = [asyncio.create_task(client_loop(i)) for i in range(num_clients)]
        running_before = await sample_running(30)
        change = await http.post("/admin/config", headers=AUTH,
                                 json={"max_num_seqs": new_limit, "enable_prefix_caching": False})
        running_after = await sample_running(30)
        stop.set()
        await asyncio.gather(*clients)
    return running_before, running_after, statuses, change.json()


def test_speculation_and_quantization_switch_live(admin_server: RuntimeServer) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
            "draft_model": None}
    response = httpx.post(f"{admin_server.url}/admin/config", headers=AUTH, json={"speculative": spec})
    assert response.status_code == 200 and response.json()["speculative"] == spec
    labels = admin_server.metric_labels("vllm:cache_config_info")
    assert '"num_speculative_tokens":3' in labels["speculative_config"]
    body = {"model": MODEL_NAME, "prompt": "a b c a b c a b c a b", "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}  # greedy on this checkpoint repeats tokens, so n-gram lookup finds drafts
    assert httpx.post(f"{admin_server.url}/v1/completions", json=body, timeout=60).status_code == 200
    assert admin_server.metric("vllm:spec_decode_num_draft_tokens_total") > 0
    refused = httpx.post(f"{admin_server.url}/admin/config", headers=AUTH,
                         json={"speculative": {"method": "draft_model"}})  # no draft checkpoint named
    assert refused.status_code == 400
    quantized = httpx.post(f"{admin_server.url}/admin/config", headers=AUTH,
                           json={"speculative": None, "quantization": "int8"}, timeout=120)
    assert quantized.status_code == 200 and quantized.json()["quantization"] == "int8"
    assert quantized.json()["speculative"] is None
    assert httpx.post(f"{admin_server.url}/v1/completions", json=body, timeout=60).status_code == 200
    restored = httpx.post(f"{admin_server.url}/admin/config", headers=AUTH, json={"quantization": "none"},
                          timeout=120)
    assert restored.status_code == 200
    assert admin_server.metric_labels("vllm:cache_config_info")["quantization"] == "none"


def test_overload_answers_429_with_retry_after(start_server: Callable[..., RuntimeServer]) -> None:
    server = start_server("--max-num-seqs", "1", "--max-waiting-requests", "1")
    statuses, retry_after = asyncio.run(_burst(server, 8))
    assert 429 in statuses and 200 in statuses
    assert all(int(value) >= 1 for value in retry_after)
    assert server.alive()


async def _burst(server: RuntimeServer, num_requests: int) -> tuple[list[int], list[str]]:
    body = {"model": MODEL_NAME, "prompt": "burst", "max_tokens": 32, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        responses = await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(num_requests)))
    refused = [r for r in responses if r.status_code == 429]
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in refused)
    return [r.status_code for r in responses], [r.headers["retry-after"] for r in refused]
