"""Against a real runtime process: the client's percentiles land in the server histogram bucket of the server's.

TTFT: the server's clock runs from the handler's submit (after HTTP parsing and tokenization) to the sampled first
token, the client's from its send to the first SSE chunk with text, so every request's client TTFT contains its
server TTFT and the client's bucket is never below the server's. Above it, measured on the shared 2-core box under
this test's load: +3 ms per request when sent one at a time, but +10-26 ms at the P50 under load (the event loop
waits for the GIL held by the engine thread's step, before submit and again to write the chunk). The P99 sits in
the 100-250 ms bucket and the client is in it or the next; the P50 sits in 20 ms wide buckets, so the overhead put
the client two buckets up in 1 of 7 windows: only its lower bound is asserted (open: runtime-side overhead).

A tiny checkpoint is built by the test and served by `python -m gpu_runtime serve` on CPU; the load generator
drives it, and the same window is read from the server by scraping /metrics before and after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from gpu_runtime.checkpoint import build_checkpoint
from slotune.loadgen.runner import RunPlan, run_workload
from slotune.loadgen.stats import client_snapshot, request_latencies_ms, summarize
from slotune.metrics.names import names_for
from slotune.metrics.scrape import scrape_snapshot
from slotune.slo import SLOSpec
from slotune.snapshot import LatencyMetric, MetricsSnapshot
from slotune.workload import WorkloadSpec, plan_requests
from tests.harness.ports import free_port
from tests.harness.runtime import RuntimeServer

MODEL = "tiny"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_dir = build_checkpoint(tmp_path_factory.mktemp("ckpt"), preset="tiny")
    server = RuntimeServer(model_dir, tmp_path_factory.mktemp("server"), served_model_name=MODEL)
    try:
        yield server.url
    finally:
        server.stop()


def _workload() -> WorkloadSpec:
    return WorkloadSpec.model_validate({
        "profile": "custom", "arrival": "poisson", "requestRatePerS": 8.0,
        "promptTokens": {"p50": 40, "p99": 120, "max": 200}, "outputTokens": {"p50": 12, "p99": 32, "max": 40},
    })


def _run(url: str, num_requests: int, warmup: int) -> tuple[MetricsSnapshot, list, float]:
    plan = RunPlan(urls=(url,), num_requests=num_requests, warmup_requests=warmup, seed=1, show_progress=False)
    result = asyncio.run(run_workload(_workload(), plan))
    return client_snapshot(result.records, result.duration_s), list(result.records), result.duration_s


def _measure_window(url: str) -> tuple[MetricsSnapshot, MetricsSnapshot, list, float]:
    """(server, client, records, duration): one loaded window seen from both sides."""
    _run(url, num_requests=4, warmup=2)  # warm up outside the measured window
    holder: dict[str, tuple] = {}

    def load_during_window(window_s: float) -> None:  # the scrape's wait is when the load runs
        holder["client"] = _run(url, num_requests=80, warmup=0)

    server = scrape_snapshot([f"{url}/metrics"], 0.0, names_for("builtin"), {"model_name": MODEL},
                             min_requests=80, sleep=load_during_window)
    client, records, duration_s = holder["client"]
    return server, client, records, duration_s


def _bucket_index(snapshot: MetricsSnapshot, metric: LatencyMetric, value_ms: float) -> int:
    histogram = snapshot.latency(metric).histogram
    assert histogram is not None
    return histogram.upper_s.index(histogram.bucket_of(value_ms / 1000)[1])


@pytest.fixture(scope="module")
def window(runtime: str) -> tuple[MetricsSnapshot, MetricsSnapshot, list, float]:
    return _measure_window(runtime)


def test_both_sides_count_the_same_requests_and_tokens(window: tuple) -> None:
    server, client, records, duration_s = window
    assert client.num_requests == 80 and client.num_failed_requests == 0 and server.num_requests == 80
    assert server.generation_tokens_per_s * server.window_s == pytest.approx(sum(r.output_tokens for r in records))
    summary = summarize(records, duration_s, SLOSpec.model_validate({"ttft": {"p99": 60_000}})).json()
    assert summary["completed"] == 80 and summary["slo_attainment"] == 1.0


@pytest.mark.parametrize("metric", [LatencyMetric.TPOT, LatencyMetric.E2E])
@pytest.mark.parametrize("percentile", [50, 99])
def test_client_percentiles_fall_in_the_server_bucket(window: tuple, metric: LatencyMetric, percentile: int) -> None:
    server, client, _, _ = window
    server_bucket = _bucket_index(server, metric, server.latency(metric).at(percentile))
    client_bucket = _bucket_index(server, metric, client.latency(metric).at(percentile))
    # The same bucket, or its neighbour when a value sits within clock jitter of a shared edge (seen: client TPOT
    # p50 10.008 ms against the 10 ms edge).
    assert abs(client_bucket - server_bucket) <= 1, (metric, percentile, server_bucket, client_bucket)


def _ttft_buckets(window: tuple, percentile: int) -> tuple[int, int]:
    """(server bucket, client bucket) of TTFT at `percentile`."""
    server, _, records, _ = window
    server_bucket = _bucket_index(server, LatencyMetric.TTFT, server.ttft.at(percentile))
    # The order statistic histogram_quantile's bucket holds (rank ceil(q*n)), so "client >= server per request"
    # carries over to the percentiles exactly; numpy's default interpolation could sit one order statistic lower.
    client_ms = float(np.percentile(request_latencies_ms(records, LatencyMetric.TTFT), percentile,
                                    method="inverted_cdf"))
    return server_bucket, _bucket_index(server, LatencyMetric.TTFT, client_ms)


def test_client_ttft_p99_is_in_the_server_bucket_or_the_next(window: tuple) -> None:
    server_bucket, client_bucket = _ttft_buckets(window, 99)
    assert client_bucket - server_bucket in (0, 1), (server_bucket, client_bucket)


def test_client_ttft_p50_is_in_the_server_bucket_or_the_next(window: tuple) -> None:
    # On a quiet machine the client's TTFT exceeds the server's by 3-4 ms on average (HTTP, SSE, loopback); the
    # P50 sits in 20 ms buckets. Under heavy foreign load the gap grew to 10-26 ms (seen while other suites ran).
    server_bucket, client_bucket = _ttft_buckets(window, 50)
    assert client_bucket - server_bucket in (0, 1), (server_bucket, client_bucket)


def test_unreachable_server_requests_are_counted_as_failures() -> None:
    plan = RunPlan(urls=(f"http://127.0.0.1:{free_port()}",), model=MODEL, num_requests=5, warmup_requests=0,
                   show_progress=False)
    result = asyncio.run(run_workload(_workload(), plan))
    summary = summarize(result.records, result.duration_s, SLOSpec.model_validate({"ttft": {"p99": 1000}}))
    assert summary.completed == 0 and summary.failed == 5 and summary.slo_attainment == 0.0


def test_planned_prompt_lengths_hold_on_the_servers_tokenizer(runtime: str) -> None:
    # The tiny checkpoint's small BPE vocabulary splits the load generator's words (~1.7 tokens each); the warm-up
    # measures that and the measured requests are scaled to it.
    _, records, _ = _run(runtime, num_requests=12, warmup=4)
    planned = [r.prompt_tokens for r in plan_requests(_workload(), 12, seed=1)]
    served = [r.prompt_tokens for r in sorted(records, key=lambda r: r.index) if not r.warmup]
    assert len(served) == len(planned) == 12
    assert sum(served) == pytest.approx(sum(planned), rel=0.15)
