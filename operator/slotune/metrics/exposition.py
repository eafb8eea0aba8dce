"""Reading one Prometheus text exposition (`GET /metrics`): parsing, label selection, summing over series.

`Exposition.parse` wraps prometheus_client's own parser. Readers select series by exact label values (the same
filter a PromQL `{model_name="m"}` selector applies) and sum over what matches, so several replicas or several
label sets of one metric read as one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from slotune.metrics.names import counter_sample


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted (label, value) pairs
    value: float

    def matches(self, selector: Mapping[str, str]) -> bool:
        labels = dict(self.labels)
        return all(labels.get(key) == value for key, value in selector.items())

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class HistogramReading:
    """Cumulative bucket counts (Prometheus `le` semantics) plus `_sum` and `_count` of one histogram."""

    upper_s: tuple[float, ...]  # ascending, ends with +inf
    cumulative: tuple[float, ...]
    sum_s: float
    count: float

    def minus(self, earlier: HistogramReading) -> HistogramReading:
        """The observations between two readings; a reset (a restarted replica) counts from zero, like rate()."""
        if self.count < earlier.count or self.upper_s != earlier.upper_s:
            return self
        return HistogramReading(
            self.upper_s, tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True)),
            self.sum_s - earlier.sum_s, self.count - earlier.count,
        )

    def per_bucket(self) -> tuple[float, ...]:
        previous = (0.0, *self.cumulative[:-1])
        return tuple(max(0.0, c - p) for c, p in zip(self.cumulative, previous, strict=True))


def add_histograms(readings: Iterable[HistogramReading]) -> HistogramReading | None:
    """Sum over replicas; all must share bucket bounds (they do for one engine version)."""
    total: HistogramReading | None = None
    for reading in readings:
        if total is None:
            total = reading
            continue
        if reading.upper_s != total.upper_s:
            raise ValueError(f"histogram buckets differ between series: {reading.upper_s} vs {total.upper_s}")
        total = HistogramReading(
            total.upper_s, tuple(a + b for a, b in zip(total.cumulative, reading.cumulative, strict=True)),
            total.sum_s + reading.sum_s, total.count + reading.count,
        )
    return total


@dataclass(frozen=True)
class Exposition:
    """All samples of one scrape."""

    samples: tuple[Sample, ...]

    @classmethod
    def parse(cls, text: str) -> Exposition:
        samples = []
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted((k, str(v)) for k, v in sample.labels.items()))
                samples.append(Sample(sample.name, labels, float(sample.value)))
        return cls(tuple(samples))

    def select(self, name: str, selector: Mapping[str, str]) -> list[Sample]:
        return [s for s in self.samples if s.name == name and s.matches(selector)]

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def counter(self, name: str, selector: Mapping[str, str]) -> float | None:
        """Sum of a counter (declared name, `_total` added) over matching series; None when not exposed."""
        found = self.select(counter_sample(name), selector)
        return sum(s.value for s in found) if found else None

    def gauges(self, name: str, selector: Mapping[str, str]) -> list[float]:
        return [s.value for s in self.select(name, selector)]

    def histogram(self, name: str, selector: Mapping[str, str]) -> HistogramReading | None:
        """One histogram summed over every matching label set (apart from `le`)."""
        by_series: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        for sample in self.select(f"{name}_bucket", selector):
            series = tuple(kv for kv in sample.labels if kv[0] != "le")
            by_series.setdefault(series, {})[float(sample.label("le") or math.inf)] = sample.value
        readings = []
        for series, buckets in by_series.items():
            labels = dict(series)
            sum_s = sum(s.value for s in self.select(f"{name}_sum", labels))
            count = sum(s.value for s in self.select(f"{name}_count", labels))
            upper = tuple(sorted(buckets))
            readings.append(HistogramReading(upper, tuple(buckets[u] for u in upper), sum_s, count))
        return add_histograms(readings)
