"""Server-side snapshot without Prometheus: scrape every replica's `/metrics` twice and difference.

Counters and histograms are differenced per replica (a replica that restarted in between counts from zero, as
PromQL's rate() does) and then summed over replicas; gauges are averaged over the two scrapes and over replicas
(running and waiting are per replica, as the engine's batch is: `MetricsSnapshot`). Percentiles follow
histogram_quantile's rule, so a scrape and a PromQL query over the same window give the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import httpx

from slotune.metrics.exposition import Exposition, HistogramReading, add_histograms
from slotune.metrics.names import MetricNames
from slotune.metrics.window import (
    LengthTotals,
    MetricsUnavailable,
    UnavailableReason,
    WindowReadings,
    require_samples,
    summary_from_reading,
)
from slotune.snapshot import LatencyMetric, MetricsSnapshot, Source


def fetch_exposition(client: httpx.Client, url: str) -> Exposition:
    try:
        response = client.get(url)
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise MetricsUnavailable(UnavailableReason.UNREACHABLE, f"{url}: {error}") from error
    return Exposition.parse(response.text)


def _counter_increase(before: Exposition, after: Exposition, name: str | None, selector: Mapping[str, str]
                      ) -> float | None:
    if name is None:
        return None
    start, end = before.counter(name, selector), after.counter(name, selector)
    if end is None:
        return None
    return end if start is None or end < start else end - start


def _sum_replicas(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _gauge_mean(scrapes: Sequence[Exposition], name: str | None, selector: Mapping[str, str]) -> float | None:
    """Mean over scrape times and replicas."""
    if name is None:
        return None
    values = [v for scrape in scrapes for v in scrape.gauges(name, selector)]
    if not values:
        return None
    return sum(values) / len(values)


def _histogram_increase(pairs: Sequence[tuple[Exposition, Exposition]], name: str,
                        selector: Mapping[str, str]) -> HistogramReading | None:
    """A histogram's increase over the window, all replicas added (a replica absent at the start counts whole)."""
    deltas = []
    for before, after in pairs:
        end, start = after.histogram(name, selector), before.histogram(name, selector)
        if end is not None:
            deltas.append(end if start is None else end.minus(start))
    return add_histograms(deltas)


def _length_totals(pairs: Sequence[tuple[Exposition, Exposition]], name: str | None,
                   selector: Mapping[str, str]) -> LengthTotals | None:
    reading = _histogram_increase(pairs, name, selector) if name is not None else None
    return LengthTotals(reading.sum_s, reading.count) if reading is not None else None


def readings_from_scrapes(
    before: Sequence[Exposition], after: Sequence[Exposition], window_s: float, names: MetricNames,
    selector: Mapping[str, str],
) -> WindowReadings:
    """Readings of one window from per-replica scrapes at its start (`before`) and end (`after`), index-aligned."""
    if not before:
        raise ValueError("scrape at least one /metrics URL")
    if not any(a.has(f"{h}_count") for a in after for h in names.histograms.values()):
        raise MetricsUnavailable(UnavailableReason.NOT_EXPOSED, "no latency histograms of the expected engine")
    pairs = list(zip(before, after, strict=True))

    def increase(name: str | None) -> float | None:
        return _sum_replicas([_counter_increase(b, a, name, selector) for b, a in pairs])

    histograms = {metric: _histogram_increase(pairs, name, selector) for metric, name in names.histograms.items()}
    e2e = histograms.get(LatencyMetric.E2E)
    scrapes = [*before, *after]
    return WindowReadings(
        window_s=window_s,
        latencies={metric: summary_from_reading(h) for metric, h in histograms.items()},
        num_requests=increase(names.request_success) or (e2e.count if e2e else 0.0),
        prompt_tokens=increase(names.prompt_tokens), generation_tokens=increase(names.generation_tokens),
        prefix_cache_queries=increase(names.prefix_cache_queries), prefix_cache_hits=increase(names.prefix_cache_hits),
        prefix_cache_hit_rate=_gauge_mean(scrapes, names.prefix_cache_hit_rate, selector),
        spec_drafts=increase(names.spec_drafts), spec_draft_tokens=increase(names.spec_draft_tokens),
        spec_accepted_tokens=increase(names.spec_accepted_tokens),
        spec_accept_length=_gauge_mean(scrapes, names.spec_accept_length, selector),
        num_running_mean=_gauge_mean(scrapes, names.num_running, selector),
        num_waiting_mean=_gauge_mean(scrapes, names.num_waiting, selector),
        kv_cache_usage_mean=_gauge_mean(scrapes, names.kv_cache_usage, selector),
        num_preemptions=increase(names.num_preemptions),
        prompt_lengths=_length_totals(pairs, names.request_prompt_tokens, selector),
        generation_lengths=_length_totals(pairs, names.request_generation_tokens, selector),
    )


def scrape_snapshot(
    urls: Sequence[str], window_s: float, names: MetricNames, selector: Mapping[str, str] | None = None,
    min_requests: int = 1, sleep: Callable[[float], None] = time.sleep, timeout_s: float = 10.0,
) -> MetricsSnapshot:
    """Scrape every URL, wait `window_s`, scrape again; the window is the measured time between the scrapes."""
    selector = selector or {}
    with httpx.Client(timeout=timeout_s) as client:
        started = time.monotonic()
        before = [fetch_exposition(client, url) for url in urls]
        sleep(window_s)
        after = [fetch_exposition(client, url) for url in urls]
        measured_s = time.monotonic() - started
    readings = readings_from_scrapes(before, after, measured_s, names, selector)
    return require_samples(readings, min_requests).to_snapshot(Source.SCRAPE)
