"""Server-side snapshot from Prometheus: PromQL over a window, filtered by namespace, deployment and model.

The only module that talks to Prometheus (its HTTP API, `GET /api/v1/query`, through prometheus-api-client). Histograms
are read as bucket increases summed over replicas (`sum by (le) (increase(<name>_bucket{sel}[w]))`), and percentiles
computed from them by histogram_quantile's own rule, so they equal PromQL's and the buckets come along as evidence for
confidence intervals (slotune.loadgen.compare). Counters are `increase()`d, gauges `avg_over_time`d. Queries can group
by deployment, so one set of queries reads every deployment of a namespace whose windows end together. Prometheus down,
nothing matching the selector, or too few requests in the window raise `MetricsUnavailable`, never zeros.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from prometheus_client import Counter
from requests.adapters import Retry

from slotune.metrics.exposition import HistogramReading
from slotune.metrics.names import MetricNames, counter_sample
from slotune.metrics.window import (
    LengthTotals,
    MetricsUnavailable,
    UnavailableReason,
    WindowReadings,
    require_samples,
    summary_from_reading,
)
from slotune.snapshot import LatencyMetric, MetricsSnapshot, Source

PROMQL_QUERIES = Counter("slotune_operator_promql_queries", "PromQL queries sent to Prometheus")


@dataclass(frozen=True)
class Selector:
    """Which series belong to the deployment: label equality on namespace, deployment and the engine's model label;
    `deployments`, a set of deployments instead of one (a regex of their names, each matched literally)."""

    namespace: str | None = None
    deployment: str | None = None
    model: str | None = None
    extra: tuple[tuple[str, str], ...] = ()
    deployments: frozenset[str] | None = None

    def promql(self, model_label: str) -> str:
        pairs = [("namespace", self.namespace), ("deployment", self.deployment), (model_label, self.model),
                 *self.extra]
        matchers = [f"{key}={_quoted(value)}" for key, value in pairs if value is not None]
        if self.deployments is not None:
            matchers.append(f"deployment=~{_quoted(_any_of(self.deployments))}")
        return "{" + ",".join(matchers) + "}"


def _any_of(values: frozenset[str]) -> str:
    """An RE2 alternation matching exactly these strings (PromQL anchors label regexes at both ends). Empty: a regex
    that matches nothing a label can hold."""
    return "|".join(re.escape(v) for v in sorted(values)) if values else "$^x"


def _quoted(value: str) -> str:
    """A PromQL string literal: PromQL unquotes with Go's rules, which read JSON's escapes (\\", \\\\, \\n, \\uXXXX), so
    any label value, control characters included, reaches Prometheus as written."""
    return json.dumps(value, ensure_ascii=False)


def _window(window_s: float) -> str:
    return f"{max(1, round(window_s))}s"


class PrometheusClient:
    """Instant queries against one Prometheus through prometheus-api-client's `PrometheusConnect` (the client users
    of Prometheus in Python know); every answer is a list of (labels, value). Without its retries: a tick must see
    Prometheus down at once (MetricsAvailable=False, the config kept), not after backing off 1 + 2 + 4 s on a reader
    thread. Once `stop` is set no further query is sent: a grouped read is ~30 queries, and a reader thread finishing
    one on a loaded Prometheus held the operator's exit for 10 s after SIGTERM (the interpreter joins its threads)."""

    def __init__(self, url: str, timeout_s: float = 10.0, stop: threading.Event | None = None) -> None:
        self.url = url.rstrip("/")
        self._session = requests.Session()
        self._prometheus = PrometheusConnect(self.url, retry=Retry(total=0, raise_on_status=False),
                                             session=self._session, timeout=timeout_s)
        self._stop = stop

    def close(self) -> None:
        self._session.close()

    def query(self, promql: str, at_s: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"time": f"{at_s:.3f}"} if at_s is not None else {}
        if self._stop is not None and self._stop.is_set():
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "the operator is stopping: no more queries")
        PROMQL_QUERIES.inc()
        try:
            result = self._prometheus.custom_query(promql, params=params)
        except requests.RequestException as error:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, f"Prometheus at {self.url}: {error}") from error
        except PrometheusApiClientException as error:
            status = re.match(r"HTTP Status Code (\d+)", str(error))
            if status is None or int(status.group(1)) >= 500:
                raise MetricsUnavailable(UnavailableReason.UNREACHABLE, f"Prometheus answered {error}") from error
            raise ValueError(f"PromQL {promql!r} failed: {error}") from error  # a bug in the query, not an outage
        return [(item["metric"], float(item["value"][1])) for item in result]

    def scalar(self, promql: str, at_s: float | None = None) -> float | None:
        """The single value of an aggregated query; None when nothing matched or the value is NaN."""
        result = self.query(promql, at_s)
        if not result or math.isnan(result[0][1]):
            return None
        return result[0][1]


GroupKey = tuple[str, ...]


class PromQLReader:
    """Reads one window of every group of series that `selector` matches, grouped by the `group_by` labels.

    With no `group_by`, one group: the deployment the selector names. With ("deployment", "model_name"), one set of
    queries reads every deployment of a namespace at once, which is how the operator reads a fleet's windows that
    end together. Percentiles come from the bucket increases by histogram_quantile's own rule (linear inside the
    bucket), so no query per percentile is needed.
    """

    def __init__(self, client: PrometheusClient, names: MetricNames, selector: Selector,
                 group_by: tuple[str, ...] = ()) -> None:
        self.client = client
        self.names = names
        self.labels = selector.promql(names.model_label)
        self.group_by = group_by

    def _by(self, *extra: str) -> str:
        return f"sum by ({', '.join((*self.group_by, *extra))})"

    def _key(self, labels: dict[str, str]) -> GroupKey:
        return tuple(labels.get(label, "") for label in self.group_by)

    def _grouped(self, promql: str, at_s: float) -> dict[GroupKey, float]:
        return {self._key(labels): value for labels, value in self.client.query(promql, at_s)
                if not math.isnan(value)}

    def histograms(self, name: str, window: str, at_s: float) -> dict[GroupKey, HistogramReading]:
        buckets: dict[GroupKey, list[tuple[float, float]]] = {}
        for labels, value in self.client.query(f"{self._by('le')} (increase({name}_bucket{self.labels}[{window}]))",
                                               at_s):
            buckets.setdefault(self._key(labels), []).append((float(labels["le"]), value))
        sums = self._grouped(f"{self._by()} (increase({name}_sum{self.labels}[{window}]))", at_s) if buckets else {}
        found = {}
        for key, rows in buckets.items():
            rows.sort()
            found[key] = HistogramReading(tuple(b for b, _ in rows), tuple(v for _, v in rows), sums.get(key, 0.0),
                                          rows[-1][1])
        return found

    def increases(self, counter: str | None, window: str, at_s: float) -> dict[GroupKey, float]:
        if counter is None:
            return {}
        return self._grouped(f"{self._by()} (increase({counter_sample(counter)}{self.labels}[{window}]))", at_s)

    def length_totals(self, histogram: str | None, window: str, at_s: float) -> dict[GroupKey, LengthTotals]:
        """A per-request length histogram's `_sum` and `_count` increases (no buckets: only its mean is read)."""
        if histogram is None:
            return {}
        totals = self._grouped(f"{self._by()} (increase({histogram}_sum{self.labels}[{window}]))", at_s)
        counts = self._grouped(f"{self._by()} (increase({histogram}_count{self.labels}[{window}]))", at_s)
        return {key: LengthTotals(total, counts[key]) for key, total in totals.items() if key in counts}

    def gauges(self, gauge: str | None, window: str, at_s: float) -> dict[GroupKey, float]:
        """Time-average per replica, then averaged over replicas (running and waiting are per replica)."""
        if gauge is None:
            return {}
        by = f"avg by ({', '.join(self.group_by)})"
        return self._grouped(f"{by} (avg_over_time({gauge}{self.labels}[{window}]))", at_s)

    def readings(self, window_s: float, at_s: float) -> dict[GroupKey, WindowReadings]:
        """Every group with series in the window; a group absent here exposed nothing in it."""
        window, names = _window(window_s), self.names
        histograms = {metric: self.histograms(name, window, at_s) for metric, name in names.histograms.items()}
        keys = set().union(*histograms.values()) if histograms else set()
        if not keys:
            return {}
        counters = {role: self.increases(getattr(names, role), window, at_s) for role in _COUNTER_ROLES}
        gauges = {role: self.gauges(getattr(names, role), window, at_s) for role in _GAUGE_ROLES}
        lengths = {role: self.length_totals(getattr(names, role), window, at_s) for role in _LENGTH_ROLES}
        return {key: _readings(key, window_s, histograms, counters, gauges, lengths) for key in keys}


_COUNTER_ROLES = ("request_success", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits",
                  "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "num_preemptions")
_GAUGE_ROLES = ("prefix_cache_hit_rate", "spec_accept_length", "num_running", "num_waiting", "kv_cache_usage")
_LENGTH_ROLES = ("request_prompt_tokens", "request_generation_tokens")


def _readings(key: GroupKey, window_s: float, histograms: dict[LatencyMetric, dict[GroupKey, HistogramReading]],
              counters: dict[str, dict[GroupKey, float]], gauges: dict[str, dict[GroupKey, float]],
              lengths: dict[str, dict[GroupKey, LengthTotals]]) -> WindowReadings:
    latencies = {metric: summary_from_reading(found.get(key)) for metric, found in histograms.items()}
    finished = counters["request_success"].get(key)
    if finished is None and LatencyMetric.E2E in latencies:
        finished = latencies[LatencyMetric.E2E].count
    return WindowReadings(
        window_s=window_s, latencies=latencies, num_requests=finished or 0.0,
        prompt_tokens=counters["prompt_tokens"].get(key), generation_tokens=counters["generation_tokens"].get(key),
        prefix_cache_queries=counters["prefix_cache_queries"].get(key),
        prefix_cache_hits=counters["prefix_cache_hits"].get(key),
        prefix_cache_hit_rate=gauges["prefix_cache_hit_rate"].get(key),
        spec_drafts=counters["spec_drafts"].get(key), spec_draft_tokens=counters["spec_draft_tokens"].get(key),
        spec_accepted_tokens=counters["spec_accepted_tokens"].get(key),
        spec_accept_length=gauges["spec_accept_length"].get(key),
        num_running_mean=gauges["num_running"].get(key), num_waiting_mean=gauges["num_waiting"].get(key),
        kv_cache_usage_mean=gauges["kv_cache_usage"].get(key), num_preemptions=counters["num_preemptions"].get(key),
        prompt_lengths=lengths["request_prompt_tokens"].get(key),
        generation_lengths=lengths["request_generation_tokens"].get(key),
    )


def not_exposed(names: MetricNames, selector: Selector, window_s: float) -> MetricsUnavailable:
    ttft = names.histograms.get(LatencyMetric.TTFT) or next(iter(names.histograms.values()))
    return MetricsUnavailable(UnavailableReason.NOT_EXPOSED, f"no series {ttft}_count"
                              f"{selector.promql(names.model_label)} in Prometheus in the last {_window(window_s)}")


def fleet_readings(prometheus_url: str, names: MetricNames, namespace: str, window_s: float, at_s: float,
                   deployments: frozenset[str] | None = None, stop: threading.Event | None = None,
                   ) -> dict[GroupKey, WindowReadings]:
    """The window ending at `at_s` of the `deployments` (None: every deployment) in `namespace`, keyed by
    (deployment, model label value); `stop` set ends it before its next query."""
    client = PrometheusClient(prometheus_url, stop=stop)
    try:
        selector = Selector(namespace=namespace, deployments=deployments)
        reader = PromQLReader(client, names, selector, ("deployment", names.model_label))
        return reader.readings(window_s, at_s)
    finally:
        client.close()


def promql_snapshot(
    prometheus_url: str, names: MetricNames, selector: Selector, window_s: float, at_s: float | None = None,
    min_requests: int = 1,
) -> MetricsSnapshot:
    """The snapshot of the `window_s` seconds ending at `at_s` (unix seconds; default now)."""
    client = PrometheusClient(prometheus_url)
    try:
        found = PromQLReader(client, names, selector).readings(window_s, at_s or time.time())
    finally:
        client.close()
    if () not in found:
        raise not_exposed(names, selector, window_s)
    return require_samples(found[()], min_requests).to_snapshot(Source.PROMETHEUS)
