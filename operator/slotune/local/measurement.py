"""Local mode's measurement: drive the declared workload at the replicas for one window, and read both sides.

The client side (the load generator's own timings, every request a sample) gives the SLO latencies the user would
see, with samples for the verifier's confidence intervals. The server side (the runtimes' `/metrics` scraped before
and after, or a local Prometheus when one is given) gives what the client cannot see: queue, prefill and decode
time, prefix-cache hits, batch occupancy, KV usage, preemptions. One snapshot carries both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence

import httpx

from slotune.knobs import Engine
from slotune.loadgen.runner import RunPlan, run_workload
from slotune.loadgen.stats import client_snapshot
from slotune.loadgen.workload import WorkloadSpec
from slotune.metrics.names import names_for
from slotune.metrics.promql import Selector, promql_snapshot
from slotune.metrics.scrape import fetch_exposition, readings_from_scrapes
from slotune.metrics.snapshot import MetricsSnapshot, Source
from slotune.metrics.window import MetricsUnavailable, UnavailableReason

_CLIENT_FIELDS = ("ttft", "tpot", "itl", "e2e", "request_rate_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
                  "mean_prompt_tokens", "mean_generation_tokens", "num_failed_requests", "num_requests")


class LocalMeasurement:
    """A `MeasurementSource`: each window replays the workload with a fresh seed (windows differ like real ones)."""

    def __init__(self, workload: WorkloadSpec, urls: Callable[[], Sequence[str]], model: str,
                 prometheus_url: str | None = None, warmup_requests: int = 4) -> None:
        self.workload, self.urls, self.model = workload, urls, model
        self.prometheus_url = prometheus_url
        self.warmup_requests = warmup_requests
        self.names = names_for(Engine.BUILTIN)
        self.windows = 0

    def measure(self, window_s: float) -> MetricsSnapshot:
        urls = tuple(self.urls())
        if not urls:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "no runtime is serving")
        self.windows += 1
        plan = RunPlan(urls=urls, model=self.model, duration_s=window_s, warmup_requests=self.warmup_requests,
                       seed=self.windows, show_progress=False)
        with httpx.Client(timeout=10) as scraper:
            before = [fetch_exposition(scraper, f"{url}/metrics") for url in urls]
            started = time.monotonic()
            result = asyncio.run(run_workload(self.workload, plan))
            after = [fetch_exposition(scraper, f"{url}/metrics") for url in urls]
            measured_s = time.monotonic() - started
        client = client_snapshot(result.records, result.duration_s)
        server = self._server_side(before, after, measured_s)
        return merge(client, server)

    def _server_side(self, before: list, after: list, measured_s: float) -> MetricsSnapshot | None:
        selector = {self.names.model_label: self.model}
        if self.prometheus_url:
            try:
                return promql_snapshot(self.prometheus_url, self.names, Selector(model=self.model), measured_s)
            except MetricsUnavailable:
                pass  # a local Prometheus is optional: fall back to the direct scrape taken anyway
        try:
            readings = readings_from_scrapes(before, after, measured_s, self.names, selector)
        except MetricsUnavailable:
            return None
        return readings.to_snapshot(Source.SCRAPE)


def merge(client: MetricsSnapshot, server: MetricsSnapshot | None) -> MetricsSnapshot:
    """Client-side latencies and rates with the server-side breakdown the client cannot see."""
    if server is None:
        return client
    return dataclasses.replace(server, source=Source.CLIENT, window_s=client.window_s,
                               **{name: getattr(client, name) for name in _CLIENT_FIELDS})
