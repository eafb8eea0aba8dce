"""/metrics through a real Prometheus: vLLM names and buckets, histogram_quantile on TTFT and inter-token latency,
and the KV cache returning to empty after a client disconnects mid-stream."""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Callable

import httpx
import openai

from gpu_runtime.server.metrics import ITL_BUCKETS_S, TTFT_BUCKETS_S
from tests.harness.runtime import RuntimeServer
from tests.runtime.server.conftest import MODEL_NAME

NUM_REQUESTS = 6
OUTPUT_TOKENS = 5


def _wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, interval_s: float = 0.3) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval_s)
    raise TimeoutError("condition not met in time")


def _scalar(result: list[dict]) -> float:
    [sample] = result
    return float(sample["value"][1])


def test_prometheus_answers_quantiles_of_ttft_and_itl(server: RuntimeServer, prometheus) -> None:
    ttft_before = server.metric("vllm:time_to_first_token_seconds_count", model_name=MODEL_NAME)
    itl_before = server.metric("vllm:inter_token_latency_seconds_count", model_name=MODEL_NAME)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    for index in range(NUM_REQUESTS):
        client.completions.create(
            model=MODEL_NAME, prompt=f"request {index}", max_tokens=OUTPUT_TOKENS, extra_body={"ignore_eos": True}
        )
    # Counts are exact: one TTFT per request, one inter-token observation per later output event.
    assert server.metric("vllm:time_to_first_token_seconds_count") - ttft_before == NUM_REQUESTS
    assert server.metric("vllm:inter_token_latency_seconds_count") - itl_before == NUM_REQUESTS * (OUTPUT_TOKENS - 1)
    assert server.metric("vllm:request_success_total", finished_reason="length") >= NUM_REQUESTS

    prom = prometheus(targets=[(f"127.0.0.1:{server.port}", {"runtime": "builtin"})], scrape_interval_s=1)
    prom.wait_for_scrapes()
    counted = f'sum(vllm:time_to_first_token_seconds_count{{runtime="builtin",model_name="{MODEL_NAME}"}})'
    _wait_until(lambda: bool(prom.query(counted)) and _scalar(prom.query(counted)) >= ttft_before + NUM_REQUESTS)
    for metric, buckets in (("time_to_first_token", TTFT_BUCKETS_S), ("inter_token_latency", ITL_BUCKETS_S)):
        p90 = _scalar(prom.query(f"histogram_quantile(0.9, sum by (le) (vllm:{metric}_seconds_bucket))"))
        assert math.isfinite(p90) and 0 < p90 <= buckets[-1], (metric, p90)
        mean = _scalar(prom.query(f"sum(vllm:{metric}_seconds_sum) / sum(vllm:{metric}_seconds_count)"))
        # The quantile interpolates inside a bucket; the mean is exact. Both lie within the observed buckets.
        assert 0 < mean <= buckets[-1]
    info = prom.query('vllm:cache_config_info{runtime="builtin"}')
    assert info and info[0]["metric"]["max_num_seqs"] == "32"


def test_disconnect_aborts_and_frees_the_kv_cache(server: RuntimeServer) -> None:
    aborted_before = server.metric("vllm:request_success_total", finished_reason="abort") if _has_abort(server) else 0
    body = {
        "model": MODEL_NAME,
        "prompt": "Tell a long story " * 20,
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        received = [line for _, line in zip(range(6), lines, strict=False) if line.startswith("data: ")]
        assert received
        assert server.metric("vllm:kv_cache_usage_perc") > 0  # the request holds blocks while it streams
    # Leaving the `with` closed the connection mid-stream.
    _wait_until(lambda: server.metric("vllm:num_requests_running") == 0)
    _wait_until(lambda: server.metric("vllm:kv_cache_usage_perc") == 0)
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborted_before + 1
    assert server.alive()


def test_non_streaming_disconnect_aborts_too(server: RuntimeServer) -> None:
    aborted_before = server.metric("vllm:request_success_total", finished_reason="abort") if _has_abort(server) else 0
    body = json.dumps({"model": MODEL_NAME, "prompt": "Another long one", "max_tokens": 2000, "ignore_eos": True})
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    # The connection closes once the request is seen running, not after a guessed time: a client that gave up after
    # a second lost the race once the C kernels decoded the tiny model's 1500 tokens in ~0.7 s.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        _wait_until(lambda: server.metric("vllm:num_requests_running") >= 1, interval_s=0.01)
    _wait_until(lambda: server.metric("vllm:num_requests_running") == 0)
    _wait_until(lambda: server.metric("vllm:kv_cache_usage_perc") == 0)
    # Aborted, not run to its 1500 tokens: the abort counter says which.
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborted_before + 1


def _has_abort(server: RuntimeServer) -> bool:
    try:
        server.metric("vllm:request_success_total", finished_reason="abort")
    except KeyError:
        return False
    return True
