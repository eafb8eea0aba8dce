"""One window read per pod and split into two arms: the canary pod, and its sibling pods pooled.

Canary verification (slotune.judge.canary) compares the two arms over the same window, so it needs series per pod: the
runtime's metrics carry a `pod` target label (the ServiceMonitor that slotune.manifests.resources builds sets it from
the pod name; the e2e harness registers each runtime under it). The reads are the same PromQL as a deployment's window
(slotune.metrics.promql), grouped by `pod`; the siblings' readings are pooled here: counters and bucket counts summed,
gauges averaged (running and waiting are per replica, as in a deployment's window).
"""

from __future__ import annotations

import functools
import operator
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields

from slotune.metrics.names import MetricNames
from slotune.metrics.promql import PrometheusClient, PromQLReader, Selector
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, WindowReadings
from slotune.snapshot import MetricsSnapshot, Source

_GAUGES = frozenset({"prefix_cache_hit_rate", "spec_accept_length", "num_running_mean", "num_waiting_mean",
                     "kv_cache_usage_mean"})


@dataclass(frozen=True)
class ArmWindows:
    """The same window of both arms."""

    canary_pod: str
    canary: MetricsSnapshot
    baseline_pods: tuple[str, ...]
    baseline: MetricsSnapshot  # the sibling pods pooled

    def describe(self) -> str:
        return (f"canary pod {self.canary_pod} ({self.canary.num_requests} requests) vs "
                f"{len(self.baseline_pods)} sibling pod(s) ({self.baseline.num_requests} requests), same window")


def pool_readings(readings: Sequence[WindowReadings]) -> WindowReadings:
    """Several replicas' readings of one window as one: counters and bucket counts summed, gauges averaged."""
    if not readings:
        raise ValueError("pool at least one replica's readings")
    first = readings[0]
    latencies = {metric: functools.reduce(lambda a, b: a.pooled(b), (r.latencies[metric] for r in readings[1:]
                                                                     if metric in r.latencies), summary)
                 for metric, summary in first.latencies.items()}
    values = {}
    for field in fields(WindowReadings):
        if field.name in ("window_s", "latencies"):
            continue
        found = [v for r in readings if (v := getattr(r, field.name)) is not None]
        if not found:
            values[field.name] = None
        elif field.name in _GAUGES:
            values[field.name] = statistics.fmean(found)
        else:  # counts, and length totals (which add as pairs)
            values[field.name] = functools.reduce(operator.add, found)
    return WindowReadings(window_s=first.window_s, latencies=latencies, **values)


FIRST_POD = ""  # asked as the canary pod: the first pod by name (where a live canary goes) against the others


def split_arms(by_pod: dict[str, WindowReadings], canary_pod: str) -> ArmWindows:
    """The canary pod's readings and its siblings' pooled; MetricsUnavailable when an arm has no series. FIRST_POD
    splits a window without a canary the same way, for the pods' A/A spread (slotune.judge.canary_noise)."""
    if canary_pod == FIRST_POD and by_pod:
        canary_pod = min(by_pod)
    siblings = sorted(pod for pod in by_pod if pod != canary_pod)
    if canary_pod not in by_pod or not siblings:
        missing = f"canary pod {canary_pod}" if canary_pod not in by_pod else "sibling pods"
        raise MetricsUnavailable(UnavailableReason.NOT_EXPOSED, f"no per-pod series of the {missing} in the window")
    canary = by_pod[canary_pod].to_snapshot(Source.PROMETHEUS)
    baseline = pool_readings([by_pod[pod] for pod in siblings]).to_snapshot(Source.PROMETHEUS)
    return ArmWindows(canary_pod, canary, tuple(siblings), baseline)


def arm_windows(prometheus_url: str, names: MetricNames, selector: Selector, canary_pod: str, window_s: float,
                at_s: float) -> ArmWindows:
    """The window of `window_s` seconds ending at `at_s` (unix seconds), per arm, from per-pod series."""
    client = PrometheusClient(prometheus_url)
    try:
        found = PromQLReader(client, names, selector, group_by=("pod",)).readings(window_s, at_s)
    finally:
        client.close()
    return split_arms({key[0]: readings for key, readings in found.items() if key[0]}, canary_pod)
