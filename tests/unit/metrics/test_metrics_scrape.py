"""Parsing vLLM-format /metrics text and differencing two scrapes gives the snapshot the observations imply."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slotune.knobs import Engine
from slotune.metrics.exposition import Exposition
from slotune.metrics.names import names_for
from slotune.metrics.scrape import readings_from_scrapes
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, summary_from_reading
from slotune.snapshot import Histogram as WindowHistogram
from slotune.snapshot import LatencyMetric, Source
from tests.unit.metrics_fake_vllm import FakeVllm

DATA = Path(__file__).parents[2] / "data"
MODEL = {"model_name": "tiny"}


def test_recorded_vllm_text_parses_to_the_expected_sums() -> None:
    exposition = Exposition.parse((DATA / "vllm_metrics_sample.txt").read_text())
    ttft = exposition.histogram("vllm:time_to_first_token_seconds", MODEL)
    assert ttft is not None and ttft.count == 120 and ttft.sum_s == pytest.approx(10.8)
    assert ttft.upper_s[-1] == np.inf and ttft.cumulative[-1] == 120
    # 40 at 30 ms, 40 at 70 ms, 20 at 90 ms, 10 at 200 ms, 10 at 300 ms: rank 60 sits halfway into (60, 80] ms
    summary = summary_from_reading(ttft)
    assert summary.p50_ms == pytest.approx(70.0) and summary.mean_ms == pytest.approx(90.0)
    assert summary.p99_ms == pytest.approx(250 + 250 * (118.8 - 110) / 10)
    assert exposition.counter("vllm:prompt_tokens", MODEL) == 153600
    assert exposition.counter("vllm:request_success", MODEL) == 120  # summed over finished_reason
    assert exposition.counter("vllm:request_success", MODEL | {"finished_reason": "stop"}) == 20
    assert exposition.histogram("vllm:time_to_first_token_seconds", {"model_name": "other"}) is None
    assert exposition.gauges("vllm:kv_cache_usage_perc", MODEL) == [0.25]


def test_two_scrapes_difference_into_the_window_snapshot() -> None:
    server = FakeVllm()
    for _ in range(10):
        server.finish(ttft_s=5.0, e2e_s=20.0, prompt_tokens=1000)  # before the window: must not count
    server.queries.inc(500)
    before = Exposition.parse(server.text())
    rng = np.random.default_rng(0)
    ttfts_s = rng.uniform(0.02, 0.09, 400)
    for ttft_s in ttfts_s:
        server.finish(ttft_s=float(ttft_s), e2e_s=float(ttft_s) + 0.6, prompt_tokens=100)
    server.queries.inc(4000)
    server.hits.inc(3000)
    server.running.set(6)
    after = Exposition.parse(server.text())

    readings = readings_from_scrapes([before], [after], 10.0, names_for(Engine.VLLM), MODEL)
    snapshot = readings.to_snapshot(Source.SCRAPE)
    assert snapshot.num_requests == 400 and snapshot.request_rate_per_s == 40.0
    assert snapshot.prompt_tokens_per_s == 4000.0 and snapshot.mean_prompt_tokens == 100.0
    assert snapshot.prefix_cache_hit_rate == 0.75
    assert snapshot.num_running_mean == 6.0 / 2  # 0 at the first scrape, 6 at the second
    assert snapshot.ttft.count == 400 and snapshot.ttft.mean_ms == pytest.approx(ttfts_s.mean() * 1000)
    # the true percentile lies inside the bucket the histogram reports it in
    for percentile in (50, 95, 99):
        truth_s = float(np.percentile(ttfts_s, percentile))
        reported_s = snapshot.ttft.at(percentile) / 1000
        assert snapshot.ttft.histogram is not None
        assert snapshot.ttft.histogram.bucket_of(reported_s) == snapshot.ttft.histogram.bucket_of(truth_s)
    assert snapshot.e2e.p50_ms is not None and 500 < snapshot.e2e.p50_ms <= 800
    assert snapshot.tpot.count == 400 and 500 < snapshot.tpot.p50_ms <= 750  # (e2e - ttft) / (2 - 1) = 600 ms
    assert snapshot.decode.mean_ms == pytest.approx(600.0)
    assert snapshot.spec_acceptance_rate is None  # not exposed: unknown, not zero


def test_mean_lengths_are_those_of_the_requests_that_finished_in_the_window() -> None:
    """vLLM counts prompt tokens at prefill and finished requests at the end: on a window where the load falls, the
    requests finishing were prefilled before it and those prefilled in it finish after it. The counter ratio reads
    (300 * 40) / 100 = 120 tokens a request here; the requests that finished had 100 and 7."""
    server = FakeVllm()
    for _ in range(100):
        server.admit(100)
    before = Exposition.parse(server.text())
    for _ in range(100):
        server.finish(ttft_s=0.05, e2e_s=1.0, prompt_tokens=100, output_tokens=7, prefilled=True)
    for _ in range(40):
        server.admit(300)
    after = Exposition.parse(server.text())

    snapshot = readings_from_scrapes([before], [after], 10.0, names_for(Engine.VLLM), MODEL).to_snapshot(Source.SCRAPE)
    assert snapshot.num_requests == 100 and snapshot.prompt_tokens_per_s == 1200.0
    assert snapshot.mean_prompt_tokens == 100.0 and snapshot.mean_generation_tokens == 7.0


def test_without_length_histograms_the_mean_is_the_counter_ratio() -> None:
    """An engine exposing only the token counters (SGLang, an older vLLM) still gets a mean length."""
    server = FakeVllm()
    before = Exposition.parse(server.text())
    for _ in range(20):
        server.finish(ttft_s=0.05, e2e_s=1.0, prompt_tokens=50, output_tokens=4)
    after = Exposition.parse(server.text())
    names = replace(names_for(Engine.VLLM), request_prompt_tokens=None, request_generation_tokens=None)
    snapshot = readings_from_scrapes([before], [after], 10.0, names, MODEL).to_snapshot(Source.SCRAPE)
    assert snapshot.mean_prompt_tokens == 50.0 and snapshot.mean_generation_tokens == 4.0


def test_replicas_sum_and_a_restarted_replica_counts_from_zero() -> None:
    first, second = FakeVllm(), FakeVllm()
    for _ in range(50):
        second.finish(ttft_s=0.05, e2e_s=1.0, prompt_tokens=10)
    before = [Exposition.parse(first.text()), Exposition.parse(second.text())]
    for _ in range(30):
        first.finish(ttft_s=0.009, e2e_s=1.0, prompt_tokens=10)
    restarted = FakeVllm()  # the second replica restarted: its counters start over
    for _ in range(20):
        restarted.finish(ttft_s=0.3, e2e_s=1.0, prompt_tokens=10)
    after = [Exposition.parse(first.text()), Exposition.parse(restarted.text())]
    snapshot = readings_from_scrapes(before, after, 5.0, names_for("builtin"), MODEL).to_snapshot(Source.SCRAPE)
    assert snapshot.num_requests == 50 and snapshot.prompt_tokens_per_s == 100.0
    assert snapshot.ttft.histogram is not None
    expected = WindowHistogram(snapshot.ttft.histogram.upper_s, snapshot.ttft.histogram.counts)
    assert expected.counts[2] == 30 and expected.counts[9] == 20  # (0.005, 0.01] and (0.25, 0.5]


def test_occupancy_is_per_replica_like_the_batch_limit_it_is_compared_with() -> None:
    """Counters sum over replicas, but running and waiting are what one engine batches and queues: max_num_seqs
    bounds each replica, so two replicas running 12 and 4 run 8 on average, not 16."""
    busy, idle = FakeVllm(), FakeVllm()
    busy.running.set(12)
    busy.waiting.set(3)
    idle.running.set(4)
    scrapes = [Exposition.parse(busy.text()), Exposition.parse(idle.text())]
    snapshot = readings_from_scrapes(scrapes, scrapes, 5.0, names_for("builtin"), MODEL).to_snapshot(Source.SCRAPE)
    assert snapshot.num_running_mean == 8.0 and snapshot.num_waiting_mean == 1.5


def test_a_server_without_the_engines_metrics_is_unavailable_not_zero() -> None:
    empty = Exposition.parse("# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 1.0\n")
    with pytest.raises(MetricsUnavailable) as raised:
        readings_from_scrapes([empty], [empty], 1.0, names_for("vllm"), MODEL)
    assert raised.value.reason == UnavailableReason.NOT_EXPOSED


def test_sglang_names_map_to_the_same_roles() -> None:
    names = names_for("sglang")
    assert names.histograms[LatencyMetric.TTFT] == "sglang:time_to_first_token_seconds"
    assert names.prefix_cache_hit_rate == "sglang:cache_hit_rate" and names.prefix_cache_hits is None
    assert names_for("builtin") is names_for("vllm")
