"""Against a real Prometheus: the PromQL snapshot and the direct-scrape snapshot of one window agree.

The target is a real HTTP /metrics endpoint (prometheus_client's server) with vLLM's names; what it reports is set
by the test, so both readers see the same known observations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

from slotune.metrics.exposition import Exposition
from slotune.metrics.names import names_for
from slotune.metrics.promql import Selector, promql_snapshot
from slotune.metrics.scrape import readings_from_scrapes
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.snapshot import LatencyMetric, MetricsSnapshot, Source
from tests.harness.ports import free_port
from tests.unit.metrics_fake_vllm import FakeVllm, send_text_format

SCRAPE_INTERVAL_S = 0.5
LABELS = {"namespace": "serving", "deployment": "chat"}


def _text_format_handler(server: FakeVllm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            send_text_format(self, server.registry)

        def log_message(self, *_: object) -> None:
            pass

    return Handler


@pytest.fixture
def exporter() -> Iterator[tuple[FakeVllm, int]]:
    server = FakeVllm(model="tiny")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _text_format_handler(server))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield server, httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _scrape(port: int) -> Exposition:
    return Exposition.parse(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)


def _drive_load(server: FakeVllm, rng: np.random.Generator) -> None:
    for _ in range(6):
        for _ in range(50):
            ttft_s = float(rng.lognormal(np.log(0.05), 0.6))
            server.finish(ttft_s=ttft_s, e2e_s=ttft_s + float(rng.uniform(0.4, 3.0)), prompt_tokens=200,
                          output_tokens=int(rng.integers(2, 30)), queue_s=ttft_s * 0.3)
        server.queries.inc(1000)
        server.hits.inc(600)
        time.sleep(0.5)


def _agree(promql: MetricsSnapshot, scraped: MetricsSnapshot) -> None:
    # increase() extrapolates to the window edges (at most ~half a scrape interval each side): counts within 12%
    assert promql.num_requests == pytest.approx(scraped.num_requests, rel=0.12)
    assert promql.prompt_tokens_per_s == pytest.approx(scraped.prompt_tokens_per_s, rel=0.12)
    # a ratio of two increases over the same window: the extrapolation cancels
    assert promql.mean_prompt_tokens == pytest.approx(scraped.mean_prompt_tokens, rel=0.02)
    assert promql.mean_generation_tokens == pytest.approx(scraped.mean_generation_tokens, rel=0.02)
    assert promql.prefix_cache_hit_rate == pytest.approx(scraped.prefix_cache_hit_rate, rel=0.02)
    assert promql.num_running_mean == pytest.approx(scraped.num_running_mean)
    assert promql.kv_cache_usage == pytest.approx(scraped.kv_cache_usage)
    for metric in LatencyMetric:
        mine, theirs = promql.latency(metric), scraped.latency(metric)
        assert theirs.histogram is not None and theirs.count > 0, metric
        for percentile in (50, 95, 99):
            value_ms, expected_ms = mine.at(percentile), theirs.at(percentile)
            assert value_ms is not None and expected_ms is not None, (metric, percentile)
            assert theirs.histogram.bucket_of(value_ms / 1000) == theirs.histogram.bucket_of(expected_ms / 1000)
            assert value_ms == pytest.approx(expected_ms, rel=0.05), (metric, percentile)


def test_promql_and_direct_scrape_snapshots_agree(
    exporter: tuple[FakeVllm, int], prometheus: Callable[..., object]
) -> None:
    server, port = exporter
    # Lots of history before the window, every observation in the lowest bucket: then every cumulative bucket series
    # starts far from zero and increase()'s zero clamp scales them all alike. (History with e2e 0.2 s left the TPOT
    # buckets below 0.2 s at zero; those were not extrapolated at the window's start while the rest were, which
    # skewed the P50 by up to ~6% depending on where the scrapes fell.)
    for _ in range(5000):
        server.finish(ttft_s=0.0005, e2e_s=0.001, prompt_tokens=1, output_tokens=2)
    server.running.set(5)
    server.kv.set(0.4)
    prom = prometheus(targets=[(f"127.0.0.1:{port}", LABELS)], scrape_interval_s=SCRAPE_INTERVAL_S)
    prom.wait_for_scrapes()
    time.sleep(2 * SCRAPE_INTERVAL_S)

    before, start_s = _scrape(port), time.time()
    time.sleep(2 * SCRAPE_INTERVAL_S)  # flat edges: the window's first Prometheus sample predates the load
    _drive_load(server, np.random.default_rng(0))
    time.sleep(3 * SCRAPE_INTERVAL_S)
    after, end_s = _scrape(port), time.time()
    time.sleep(2 * SCRAPE_INTERVAL_S)  # let Prometheus ingest the last sample

    window_s = end_s - start_s
    names = names_for("builtin")
    scraped = readings_from_scrapes([before], [after], window_s, names, {"model_name": "tiny"})
    scraped_snapshot = scraped.to_snapshot(Source.SCRAPE)
    selector = Selector(namespace="serving", deployment="chat", model="tiny")
    from_prometheus = promql_snapshot(prom.url, names, selector, window_s, at_s=end_s, min_requests=100)
    assert scraped_snapshot.num_requests == 300 and from_prometheus.source == Source.PROMETHEUS
    _agree(from_prometheus, scraped_snapshot)

    elsewhere = Selector(namespace="other", model="tiny")
    with pytest.raises(MetricsUnavailable) as raised:
        promql_snapshot(prom.url, names, elsewhere, window_s, at_s=end_s)
    assert raised.value.reason == UnavailableReason.NOT_EXPOSED
    with pytest.raises(MetricsUnavailable) as raised:
        promql_snapshot(prom.url, names, selector, window_s, at_s=end_s, min_requests=10_000)
    assert raised.value.reason == UnavailableReason.TOO_FEW_SAMPLES


def _serve(server: FakeVllm) -> tuple[ThreadingHTTPServer, int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _text_format_handler(server))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]


def test_occupancy_from_prometheus_is_per_replica(prometheus: Callable[..., object]) -> None:
    """Two replicas running 12 and 4 sequences run 8 each on average, which is what max_num_seqs bounds; the
    requests they finish add up."""
    replicas = [FakeVllm(model="tiny"), FakeVllm(model="tiny")]
    served = [_serve(server) for server in replicas]
    try:
        for server, running in zip(replicas, (12, 4), strict=True):
            server.finish(ttft_s=0.0005, e2e_s=0.001, prompt_tokens=1)  # every series exists before the window
            server.running.set(running)
            server.waiting.set(running / 4)
        prom = prometheus(targets=[(f"127.0.0.1:{port}", LABELS) for _, port in served],
                          scrape_interval_s=SCRAPE_INTERVAL_S)
        prom.wait_for_scrapes()
        time.sleep(2 * SCRAPE_INTERVAL_S)
        for server in replicas:
            for _ in range(60):
                server.finish(ttft_s=0.05, e2e_s=0.5, prompt_tokens=100, output_tokens=10)
        time.sleep(4 * SCRAPE_INTERVAL_S)
        selector = Selector(namespace="serving", deployment="chat", model="tiny")
        snapshot = promql_snapshot(prom.url, names_for("builtin"), selector, 3.0, min_requests=10)
        assert snapshot.num_running_mean == pytest.approx(8.0)
        assert snapshot.num_waiting_mean == pytest.approx(2.0)
        # Counters sum over replicas; increase() only extrapolates up, by at most a scrape interval in 3 s.
        assert 120 <= snapshot.num_requests <= 120 * 3.0 / (3.0 - SCRAPE_INTERVAL_S) + 1
    finally:
        for httpd, _ in served:
            httpd.shutdown()
            httpd.server_close()


def test_prometheus_down_is_metrics_unavailable() -> None:
    with pytest.raises(MetricsUnavailable) as raised:
        promql_snapshot(f"http://127.0.0.1:{free_port()}", names_for("vllm"), Selector(), 60.0)
    assert raised.value.reason == UnavailableReason.UNREACHABLE


@pytest.mark.parametrize("model", ['llama\n8b', 'say "hi"', "back\\slash", "naïve \t tab"])
def test_any_model_label_value_selects_its_own_series(model: str, prometheus: Callable[..., object]) -> None:
    """A served model name with quotes, backslashes or control characters is still one exact label match: the
    query neither fails to parse (which used to kill the operator's tick) nor matches another model's series."""
    mine, other = FakeVllm(model=model), FakeVllm(model=model + "x")
    served = [_serve(mine), _serve(other)]
    try:
        for server in (mine, other):
            server.finish(ttft_s=0.0005, e2e_s=0.001, prompt_tokens=1)
        prom = prometheus(targets=[(f"127.0.0.1:{port}", LABELS) for _, port in served],
                          scrape_interval_s=SCRAPE_INTERVAL_S)
        prom.wait_for_scrapes()
        time.sleep(2 * SCRAPE_INTERVAL_S)
        for _ in range(40):
            mine.finish(ttft_s=0.05, e2e_s=0.5, prompt_tokens=100, output_tokens=10)
        for _ in range(400):
            other.finish(ttft_s=0.05, e2e_s=0.5, prompt_tokens=100, output_tokens=10)
        time.sleep(4 * SCRAPE_INTERVAL_S)
        selector = Selector(namespace="serving", deployment="chat", model=model)
        snapshot = promql_snapshot(prom.url, names_for("builtin"), selector, 3.0, min_requests=10)
        assert 40 <= snapshot.num_requests <= 40 * 3.0 / (3.0 - SCRAPE_INTERVAL_S) + 1
    finally:
        for httpd, _ in served:
            httpd.shutdown()
            httpd.server_close()
