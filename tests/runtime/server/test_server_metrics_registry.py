"""The metrics registry alone: vLLM names and buckets, and latencies derived exactly from engine timestamps."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_runtime.engine.llm_engine import EngineStats, RequestOutput
from gpu_runtime.engine.sequence import RequestTimes
from gpu_runtime.server.metrics import (
    REQLAT_BUCKETS_S,
    TTFT_BUCKETS_S,
    ConfigInfo,
    RuntimeMetrics,
    one_two_five_buckets,
)


def _samples(metrics: RuntimeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = text_string_to_metric_families(metrics.render().decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def _value(metrics: RuntimeMetrics, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(({"model_name": "m"} | labels).items())))
    return _samples(metrics)[key]


def _output(request_id: str, token_times: list[float], num_output: int, times: RequestTimes,
            finished: bool = False, reason: str | None = None) -> RequestOutput:
    return RequestOutput(request_id=request_id, new_token_ids=[1] * len(token_times), new_text="x",
                         num_output_tokens=num_output, num_prompt_tokens=10, num_cached_tokens=0, finished=finished,
                         finish_reason=reason, times=times, token_times=token_times)


def test_one_request_yields_exact_latencies() -> None:
    metrics = RuntimeMetrics("m", max_model_len=100)
    # arrival 0, scheduled 0.5, tokens at 1.0, 1.25, 1.75 (two events after the first).
    partial = RequestTimes(arrival=0.0, first_scheduled=0.5, first_token=1.0, last_token=1.0, finished=None)
    metrics.record_output(_output("r", [1.0], 1, partial))
    metrics.record_output(_output("r", [1.25], 2, partial))
    done = RequestTimes(arrival=0.0, first_scheduled=0.5, first_token=1.0, last_token=1.75, finished=1.75)
    metrics.record_output(_output("r", [1.75], 3, done, finished=True, reason="stop"))
    assert _value(metrics, "vllm:time_to_first_token_seconds_sum") == pytest.approx(1.0)
    assert _value(metrics, "vllm:inter_token_latency_seconds_count") == 2
    assert _value(metrics, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.75)
    assert _value(metrics, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.375)
    assert _value(metrics, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(1.75)
    assert _value(metrics, "vllm:request_queue_time_seconds_sum") == pytest.approx(0.5)
    assert _value(metrics, "vllm:request_prefill_time_seconds_sum") == pytest.approx(0.5)
    assert _value(metrics, "vllm:request_decode_time_seconds_sum") == pytest.approx(0.75)
    assert _value(metrics, "vllm:request_inference_time_seconds_sum") == pytest.approx(1.25)
    assert _value(metrics, "vllm:prompt_tokens_total") == 10 and _value(metrics, "vllm:generation_tokens_total") == 3
    assert _value(metrics, "vllm:request_success_total", finished_reason="stop") == 1
    assert _value(metrics, "vllm:request_generation_tokens_bucket", le="5.0") == 1
    assert _value(metrics, "vllm:request_generation_tokens_bucket", le="2.0") == 0


def test_aborted_requests_count_but_leave_latencies_alone() -> None:
    metrics = RuntimeMetrics("m", max_model_len=100)
    times = RequestTimes(arrival=0.0, first_scheduled=0.1, first_token=0.2, last_token=0.2, finished=5.0)
    metrics.record_output(_output("r", [0.2], 1, times))
    metrics.record_output(_output("r", [], 1, times, finished=True, reason="abort"))
    assert _value(metrics, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(metrics, "vllm:e2e_request_latency_seconds_count") == 0


def test_buckets_follow_vllm() -> None:
    metrics = RuntimeMetrics("m", max_model_len=2048)
    samples = _samples(metrics)
    ttft_les = sorted(float(dict(k[1])["le"]) for k in samples if k[0] == "vllm:time_to_first_token_seconds_bucket")
    assert ttft_les[:-1] == list(TTFT_BUCKETS_S) and ttft_les[-1] == float("inf")
    e2e_les = sorted(float(dict(k[1])["le"]) for k in samples if k[0] == "vllm:e2e_request_latency_seconds_bucket")
    assert e2e_les[:-1] == list(REQLAT_BUCKETS_S)
    assert one_two_five_buckets(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert not any(name.endswith("_created") for name, _ in samples)


def test_gauges_counters_and_config_follow_the_latest_snapshot() -> None:
    metrics = RuntimeMetrics("m", max_model_len=100)
    stats = EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.25, num_total_blocks=8, num_free_blocks=6,
                        prefix_cache_queries_tokens=40, prefix_cache_hits_tokens=16, num_preemptions=1, num_steps=9,
                        last_step_num_tokens=33)
    metrics.record_step(stats, stepped=True)
    metrics.set_config(ConfigInfo(16, "auto", 8, 0.9, 100, 4, 64, True, False, "none", "none"))
    assert _value(metrics, "vllm:num_requests_running") == 3 and _value(metrics, "vllm:num_requests_waiting") == 2
    assert _value(metrics, "vllm:kv_cache_usage_perc") == 0.25
    assert _value(metrics, "vllm:prefix_cache_hits_total") == 16
    assert _value(metrics, "vllm:prefix_cache_queries_total") == 40
    assert _value(metrics, "vllm:num_preemptions_total") == 1
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="64.0") == 1
    assert _value(metrics, "vllm:iteration_tokens_total_bucket", le="32.0") == 0
    info = {k: v for (name, labels), _ in _samples(metrics).items() if name == "vllm:cache_config_info"
            for k, v in labels}
    assert info["max_num_seqs"] == "4" and info["enable_prefix_caching"] == "false" and info["num_gpu_blocks"] == "8"
    metrics.set_config(ConfigInfo(16, "auto", 8, 0.9, 100, 2, 64, True, True, "none", "none"))
    infos = [labels for (name, labels) in _samples(metrics) if name == "vllm:cache_config_info"]
    assert len(infos) == 1 and dict(infos[0])["max_num_seqs"] == "2"  # the old label set is gone
