"""Measurement of a serving deployment: snapshots from Prometheus, direct scrapes, or the load generator."""

from slotune.metrics.names import SGLANG_NAMES, MetricNames, names_for
from slotune.metrics.promql import PrometheusClient, Selector, promql_snapshot
from slotune.metrics.scrape import scrape_snapshot
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.snapshot import Histogram, LatencyMetric, LatencySummary, MetricsSnapshot, Source

__all__ = [
    "SGLANG_NAMES",
    "Histogram",
    "LatencyMetric",
    "LatencySummary",
    "MetricNames",
    "MetricsSnapshot",
    "MetricsUnavailable",
    "PrometheusClient",
    "Selector",
    "Source",
    "UnavailableReason",
    "names_for",
    "promql_snapshot",
    "scrape_snapshot",
]
