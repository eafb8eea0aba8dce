"""Server-side snapshot from Prometheus: PromQL over a window, filtered by namespace, deployment and model.

The only module that talks to Prometheus (its HTTP API, `GET /api/v1/query`). Percentiles are PromQL's own
`histogram_quantile(q, sum by (le) (rate(<name>_bucket{sel}[w])))`, summed over replicas; bucket increases come
along as evidence for confidence intervals (slotune.loadgen.compare). Counters are `increase()`d, gauges
`avg_over_time`d. Prometheus down, nothing matching the selector, or too few requests in the window raise
`MetricsUnavailable`, never a snapshot of zeros.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import httpx

from slotune.metrics.exposition import HistogramReading
from slotune.metrics.names import MetricNames, counter_sample
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, WindowReadings, require_samples
from slotune.snapshot import Histogram, LatencyMetric, LatencySummary, MetricsSnapshot, Source

QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Selector:
    """Which series belong to the deployment: label equality on namespace, deployment and the engine's model label."""

    namespace: str | None = None
    deployment: str | None = None
    model: str | None = None
    extra: tuple[tuple[str, str], ...] = ()

    def promql(self, model_label: str) -> str:
        pairs = [("namespace", self.namespace), ("deployment", self.deployment), (model_label, self.model),
                 *self.extra]
        matchers = [f"{key}={_quoted(value)}" for key, value in pairs if value is not None]
        return "{" + ",".join(matchers) + "}"


def _quoted(value: str) -> str:
    """A PromQL string literal: PromQL unquotes with Go's rules, which read JSON's escapes (\\", \\\\, \\n, \\uXXXX), so
    any label value, control characters included, reaches Prometheus as written."""
    return json.dumps(value, ensure_ascii=False)


def _window(window_s: float) -> str:
    return f"{max(1, round(window_s))}s"


class PrometheusClient:
    """Instant queries against one Prometheus; every answer is a list of (labels, value)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def query(self, promql: str, at_s: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": promql} | ({"time": f"{at_s:.3f}"} if at_s is not None else {})
        try:
            response = self._http.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as error:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, f"Prometheus at {self.url}: {error}") from error
        if response.status_code >= 500:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, f"Prometheus answered {response.status_code}")
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"PromQL {promql!r} failed: {body.get('error')}")  # a bug in the query, not an outage
        return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]

    def scalar(self, promql: str, at_s: float | None = None) -> float | None:
        """The single value of an aggregated query; None when nothing matched or the value is NaN."""
        result = self.query(promql, at_s)
        if not result or math.isnan(result[0][1]):
            return None
        return result[0][1]


class PromQLReader:
    """Reads one deployment's window from Prometheus."""

    def __init__(self, client: PrometheusClient, names: MetricNames, selector: Selector) -> None:
        self.client = client
        self.names = names
        self.labels = selector.promql(names.model_label)

    def histogram(self, name: str, window: str, at_s: float) -> HistogramReading | None:
        rows = self.client.query(f"sum by (le) (increase({name}_bucket{self.labels}[{window}]))", at_s)
        if not rows:
            return None
        buckets = sorted((float(labels["le"]), value) for labels, value in rows)
        sum_s = self.client.scalar(f"sum(increase({name}_sum{self.labels}[{window}]))", at_s) or 0.0
        upper = tuple(b for b, _ in buckets)
        return HistogramReading(upper, tuple(v for _, v in buckets), sum_s, buckets[-1][1])

    def latency(self, name: str, window: str, at_s: float) -> LatencySummary:
        reading = self.histogram(name, window, at_s)
        if reading is None or reading.count <= 0:
            return LatencySummary()
        rate = f"sum by (le) (rate({name}_bucket{self.labels}[{window}]))"
        p50, p95, p99 = (self.client.scalar(f"histogram_quantile({q}, {rate})", at_s) for q in QUANTILES)
        return LatencySummary(
            p50_ms=_ms(p50), p95_ms=_ms(p95), p99_ms=_ms(p99), mean_ms=reading.sum_s / reading.count * 1000.0,
            count=round(reading.count), histogram=Histogram(reading.upper_s, reading.per_bucket()),
        )

    def increase(self, counter: str | None, window: str, at_s: float) -> float | None:
        if counter is None:
            return None
        return self.client.scalar(f"sum(increase({counter_sample(counter)}{self.labels}[{window}]))", at_s)

    def gauge(self, gauge: str | None, window: str, at_s: float) -> float | None:
        """Time-average per replica, then averaged over replicas (running and waiting are per replica)."""
        if gauge is None:
            return None
        return self.client.scalar(f"avg(avg_over_time({gauge}{self.labels}[{window}]))", at_s)

    def readings(self, window_s: float, at_s: float) -> WindowReadings:
        window, names = _window(window_s), self.names
        latencies = {metric: self.latency(name, window, at_s) for metric, name in names.histograms.items()}
        finished = self.increase(names.request_success, window, at_s)
        if finished is None:
            finished = latencies[LatencyMetric.E2E].count if LatencyMetric.E2E in latencies else None
        if not finished:  # tell 'nothing matches the selector' apart from 'an idle window'
            self._check_exposed(window, at_s)
        return WindowReadings(
            window_s=window_s, latencies=latencies, num_requests=finished or 0.0,
            prompt_tokens=self.increase(names.prompt_tokens, window, at_s),
            generation_tokens=self.increase(names.generation_tokens, window, at_s),
            prefix_cache_queries=self.increase(names.prefix_cache_queries, window, at_s),
            prefix_cache_hits=self.increase(names.prefix_cache_hits, window, at_s),
            prefix_cache_hit_rate=self.gauge(names.prefix_cache_hit_rate, window, at_s),
            spec_drafts=self.increase(names.spec_drafts, window, at_s),
            spec_draft_tokens=self.increase(names.spec_draft_tokens, window, at_s),
            spec_accepted_tokens=self.increase(names.spec_accepted_tokens, window, at_s),
            spec_accept_length=self.gauge(names.spec_accept_length, window, at_s),
            num_running_mean=self.gauge(names.num_running, window, at_s),
            num_waiting_mean=self.gauge(names.num_waiting, window, at_s),
            kv_cache_usage_mean=self.gauge(names.kv_cache_usage, window, at_s),
            num_preemptions=self.increase(names.num_preemptions, window, at_s),
        )

    def _check_exposed(self, window: str, at_s: float) -> None:
        ttft = self.names.histograms.get(LatencyMetric.TTFT) or next(iter(self.names.histograms.values()))
        if not self.client.query(f"count(last_over_time({ttft}_count{self.labels}[{window}]))", at_s):
            raise MetricsUnavailable(
                UnavailableReason.NOT_EXPOSED, f"no series {ttft}_count{self.labels} in Prometheus in the last {window}"
            )


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None or math.isinf(value_s) else value_s * 1000.0


def promql_snapshot(
    prometheus_url: str, names: MetricNames, selector: Selector, window_s: float, at_s: float | None = None,
    min_requests: int = 1,
) -> MetricsSnapshot:
    """The snapshot of the `window_s` seconds ending at `at_s` (unix seconds; default now)."""
    client = PrometheusClient(prometheus_url)
    try:
        readings = PromQLReader(client, names, selector).readings(window_s, at_s or time.time())
    finally:
        client.close()
    return require_samples(readings, min_requests).to_snapshot(Source.PROMETHEUS)
