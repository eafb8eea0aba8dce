"""Two recorded vLLM V1 `/metrics` scrapes, 30 s apart, read by the operator's metrics path give the snapshot the
window's traffic implies. The deployed engine is vLLM (`runtime.engine: vllm`), so this is what the operator sees.

tests/data/vllm_metrics_{a,b}.txt were written by prometheus_client with vLLM V1's metric names, help texts, labels
(`model_name`, `engine`, `finished_reason`, `position`) and bucket boundaries (docs/facts.md#metrics); they are not
captured from a running vLLM. Scrape a follows 400 lighter requests that the difference must remove. Between a and b,
60 requests finished (50 stop, 10 length):
  TTFT      30 x 70 ms, 24 x 90 ms, 6 x 300 ms           buckets (60, 80], (80, 100], (250, 500] ms
  ITL       9000 x 20 ms, 2400 x 40 ms, 600 x 180 ms     buckets (10, 25], (25, 50], (150, 200] ms
  TPOT      40 x 30 ms, 20 x 60 ms                       buckets (25, 50], (50, 75] ms
  E2E       30 x 4 s, 24 x 7 s, 6 x 12 s                 buckets (2.5, 5], (5, 10], (10, 15] s
  queue     54 x 100 ms, 6 x 400 ms                      buckets (0, 0.3], (0.3, 0.5] s
  prefill   60 x 200 ms                                  bucket (0, 0.3] s
  decode    30 x 4.5 s, 30 x 8 s                         buckets (2.5, 5], (5, 10] s
  tokens: 61200 prompt (36720 prefix-cache hits), 12060 generated; speculation: 3000 drafts, 9000 draft tokens,
  5400 accepted; 3 preemptions; gauges running 12 -> 20, waiting 0 -> 4, KV usage 0.5 -> 0.7.
Percentiles interpolate linearly inside the bucket, as PromQL's histogram_quantile does: rank = q x count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slotune.knobs import Engine
from slotune.metrics.exposition import Exposition
from slotune.metrics.names import names_for
from slotune.metrics.scrape import readings_from_scrapes
from slotune.metrics.window import require_samples
from slotune.snapshot import MetricsSnapshot, Source

DATA = Path(__file__).parents[2] / "data"
MODEL = {"model_name": "meta-llama/Llama-3.1-8B-Instruct"}
WINDOW_S = 30.0


def snapshot(selector: dict[str, str] = MODEL) -> MetricsSnapshot:
    before = Exposition.parse((DATA / "vllm_metrics_a.txt").read_text())
    after = Exposition.parse((DATA / "vllm_metrics_b.txt").read_text())
    readings = readings_from_scrapes([before], [after], WINDOW_S, names_for(Engine.VLLM), selector)
    return require_samples(readings, min_requests=50).to_snapshot(Source.SCRAPE)


def test_counts_and_rates_are_the_windows_not_the_totals() -> None:
    snap = snapshot()
    assert snap.source is Source.SCRAPE and snap.window_s == WINDOW_S
    assert snap.num_requests == 60 and snap.request_rate_per_s == pytest.approx(2.0)
    assert snap.prompt_tokens_per_s == pytest.approx(61200 / 30) and snap.mean_prompt_tokens == pytest.approx(1020)
    assert snap.generation_tokens_per_s == pytest.approx(12060 / 30)
    assert snap.mean_generation_tokens == pytest.approx(201)
    assert snap.num_preemptions == pytest.approx(3)


def test_ttft_percentiles_follow_histogram_quantile() -> None:
    ttft = snapshot().ttft
    assert ttft.count == 60
    assert ttft.p50_ms == pytest.approx(80.0)  # rank 30 ends the (60, 80] bucket
    assert ttft.p95_ms == pytest.approx(375.0)  # rank 57: 3 of 6 into (250, 500]
    assert ttft.p99_ms == pytest.approx(475.0)  # rank 59.4: 5.4 of 6 into (250, 500]
    assert ttft.mean_ms == pytest.approx((30 * 70 + 24 * 90 + 6 * 300) / 60)


def test_inter_token_and_per_request_tpot() -> None:
    snap = snapshot()
    assert snap.itl.count == 12000
    assert snap.itl.p50_ms == pytest.approx(20.0)  # rank 6000: 6000 of 9000 into (10, 25]
    assert snap.itl.p95_ms == pytest.approx(50.0)  # rank 11400 ends the (25, 50] bucket
    assert snap.itl.p99_ms == pytest.approx(190.0)  # rank 11880: 480 of 600 into (150, 200]
    assert snap.tpot.count == 60
    assert snap.tpot.p50_ms == pytest.approx(43.75)  # rank 30: 30 of 40 into (25, 50]
    assert snap.tpot.p99_ms == pytest.approx(74.25)  # rank 59.4: 19.4 of 20 into (50, 75]


def test_queue_prefill_decode_breakdown_and_e2e() -> None:
    snap = snapshot()
    assert snap.queue.p50_ms == pytest.approx(300 * 30 / 54)  # rank 30 of 54 in (0, 300]
    assert snap.queue.p95_ms == pytest.approx(400.0)  # rank 57: 3 of 6 into (300, 500]
    assert snap.prefill.p50_ms == pytest.approx(150.0)  # rank 30 of 60 in (0, 300]
    assert snap.decode.p50_ms == pytest.approx(5000.0)  # rank 30 ends (2.5, 5] s
    assert snap.e2e.p50_ms == pytest.approx(5000.0)
    assert snap.e2e.p99_ms == pytest.approx(10000 + 5000 * 5.4 / 6)  # rank 59.4: 5.4 of 6 into (10, 15] s


def test_cache_speculation_and_occupancy() -> None:
    snap = snapshot()
    assert snap.prefix_cache_hit_rate == pytest.approx(36720 / 61200)
    assert snap.spec_acceptance_rate == pytest.approx(5400 / 9000)
    assert snap.spec_mean_acceptance_length == pytest.approx(1 + 5400 / 3000)
    assert snap.num_running_mean == pytest.approx(16.0)
    assert snap.num_waiting_mean == pytest.approx(2.0)
    assert snap.kv_cache_usage == pytest.approx(0.6)


def test_the_engine_label_does_not_split_the_model() -> None:
    assert snapshot({**MODEL, "engine": "0"}) == snapshot()
