"""Measurement of a serving deployment: snapshots from Prometheus, direct scrapes, or the load generator."""

from slotune.metrics.snapshot import Histogram, LatencyMetric, LatencySummary, MetricsSnapshot, Source

__all__ = ["Histogram", "LatencyMetric", "LatencySummary", "MetricsSnapshot", "Source"]
