"""Local mode's measurement: drive the declared workload at the replicas for one window, and read both sides.

The client side (the load generator's own timings, every request a sample) gives the SLO latencies the user would
see, with samples for the verifier's confidence intervals. The server side (the runtimes' `/metrics` scraped before
and after, or a local Prometheus when one is given) gives what the client cannot see: queue, prefill and decode
time, prefix-cache hits, batch occupancy, KV usage, preemptions. One snapshot carries both.

A window starts only after `tuning.warmupSeconds` have passed since the replicas last changed (a start, restart or
live reconfiguration): the first requests after a change run on cold caches and allocators and are several times
slower (docs/facts.md#flags), so the warm-up drives the same workload and throws its measurements away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

import httpx

from slotune.knobs import Engine
from slotune.loadgen.prompts import TraceRequest
from slotune.loadgen.runner import RunPlan, run_workload
from slotune.loadgen.stats import client_snapshot
from slotune.local.trace_segment import TraceSegment
from slotune.metrics.exposition import Exposition
from slotune.metrics.names import MetricNames, names_for
from slotune.metrics.promql import Selector, promql_snapshot
from slotune.metrics.scrape import fetch_exposition, readings_from_scrapes
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.snapshot import MetricsSnapshot, Source
from slotune.workload import WorkloadSpec

WARMUP_SEED = 1_000_000  # warm-up traffic draws its own requests, never those of a measured window
_CLIENT_FIELDS = ("ttft", "tpot", "itl", "e2e", "request_rate_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
                  "mean_prompt_tokens", "mean_generation_tokens", "num_failed_requests", "num_requests")


class LocalMeasurement:
    """A `MeasurementSource`: each window replays the workload with a fresh seed (windows differ like real ones)."""

    def __init__(self, workload: WorkloadSpec, urls: Callable[[], Sequence[str]], model: str,
                 prometheus_url: str | None = None, warmup_requests: int = 4, warmup_s: float = 0.0,
                 changed_at_s: Callable[[], float | None] = lambda: None, segment: TraceSegment | None = None
                 ) -> None:
        self.workload, self.urls, self.model = workload, urls, model
        self.segment = segment  # a trace segment replayed window by window instead of the generated workload
        self.prometheus_url = prometheus_url
        self.warmup_requests = warmup_requests
        self.warmup_s = warmup_s
        self.changed_at_s = changed_at_s  # time.monotonic() of the replicas' last change, None if unknown
        self.names = names_for(Engine.BUILTIN)
        self.windows = 0
        self.window_started_at_s: float | None = None  # time.monotonic() when the last window's clock started
        self.tokens_per_word: float | None = None  # the served tokenizer's, measured once (prompts.py)

    def warm_up_left_s(self) -> float:
        changed = self.changed_at_s()
        return 0.0 if changed is None else max(0.0, changed + self.warmup_s - time.monotonic())

    def warming_up(self) -> bool:
        return self.warm_up_left_s() > 0

    def measure(self, window_s: float) -> MetricsSnapshot:
        urls = tuple(self.urls())
        if not urls:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "no runtime is serving")
        self.windows += 1
        self._warm_up(urls)
        # The warm-up ran before the first scrape, so the server side of the window holds none of its requests
        # (slow ones: the first four on a fresh tiny runtime had TTFT 33-68 ms against a window median of 15-25).
        plan = RunPlan(urls=urls, model=self.model, duration_s=window_s, warmup_requests=0, seed=self.windows,
                       show_progress=False, tokens_per_word=self.tokens_per_word)
        with httpx.Client(timeout=10) as scraper:
            before = [fetch_exposition(scraper, f"{url}/metrics") for url in urls]
            started = self.window_started_at_s = time.monotonic()
            with GaugeSampler(urls, self.names, {self.names.model_label: self.model}) as gauges:
                result = asyncio.run(run_workload(self.workload, plan, self._trace_window(window_s)))
                if self.segment is not None:  # a lull in the trace is waited out: the segment keeps its clock
                    time.sleep(max(0.0, started + window_s - time.monotonic()))
            self.tokens_per_word = result.tokens_per_word
            after = [fetch_exposition(scraper, f"{url}/metrics") for url in urls]
            measured_s = time.monotonic() - started
        if self.segment is not None:
            self.segment.record(result.records, len(urls), measured_s)
        client = client_snapshot(result.records, result.duration_s)
        server = self._server_side(before, after, measured_s)
        if server is not None and not self.prometheus_url:
            server = gauges.apply(server)
        return merge(client, server)

    def _trace_window(self, window_s: float) -> list[TraceRequest] | None:
        return None if self.segment is None else self.segment.next_window(window_s)

    def _warm_up(self, urls: tuple[str, ...]) -> None:
        """Drive the workload, unmeasured, for `warmup_requests`, and on until `warmup_s` after the last change
        (load warms what idling cannot: the batch shapes, the prefix cache, the allocator); the first run also
        calibrates prompt lengths to the served tokenizer."""
        left_s = self.warm_up_left_s()
        by_time = left_s > 0
        plan = RunPlan(urls=urls, model=self.model, duration_s=left_s if by_time else None,
                       num_requests=None if by_time else self.warmup_requests, warmup_requests=0,
                       seed=WARMUP_SEED + self.windows, show_progress=False, tokens_per_word=self.tokens_per_word)
        self.tokens_per_word = asyncio.run(run_workload(self.workload, plan)).tokens_per_word
        time.sleep(self.warm_up_left_s())  # what is left when the last arrival fell short of the end: under a gap

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


class GaugeSampler:
    """Samples the runtimes' gauges (running, waiting, KV usage) every `interval_s` while a window runs.

    Two scrapes at the window's edges see an idle server between bursts; the tuner needs the batch occupancy and
    queue length averaged over the window, as Prometheus' avg_over_time gives on Kubernetes.
    """

    def __init__(self, urls: Sequence[str], names: MetricNames, selector: dict[str, str],
                 interval_s: float = 0.5) -> None:
        self.urls, self.names, self.selector, self.interval_s = urls, names, selector, interval_s
        self.running: list[float] = []
        self.waiting: list[float] = []
        self.kv_usage: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="gauge-sampler", daemon=True)

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample_until_stopped(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.interval_s):
                try:
                    scrapes = [fetch_exposition(client, f"{url}/metrics") for url in self.urls]
                except MetricsUnavailable:
                    continue  # a missed sample only thins the average
                self._record(scrapes)

    def _record(self, scrapes: list[Exposition]) -> None:
        def total(name: str | None) -> float:
            return sum(sum(s.gauges(name, self.selector)) for s in scrapes) if name else 0.0

        # per replica, as the engine's batch is (MetricsSnapshot.num_running_mean)
        self.running.append(total(self.names.num_running) / len(scrapes))
        self.waiting.append(total(self.names.num_waiting) / len(scrapes))
        if self.names.kv_cache_usage:
            self.kv_usage.append(total(self.names.kv_cache_usage) / len(scrapes))

    def apply(self, snapshot: MetricsSnapshot) -> MetricsSnapshot:
        if not self.running:
            return snapshot
        return dataclasses.replace(
            snapshot, num_running_mean=sum(self.running) / len(self.running),
            num_waiting_mean=sum(self.waiting) / len(self.waiting),
            kv_cache_usage=sum(self.kv_usage) / len(self.kv_usage) if self.kv_usage else snapshot.kv_cache_usage,
        )


def merge(client: MetricsSnapshot, server: MetricsSnapshot | None) -> MetricsSnapshot:
    """Client-side latencies and rates with the server-side breakdown the client cannot see."""
    if server is None:
        return client
    return dataclasses.replace(server, source=Source.CLIENT, window_s=client.window_s,
                               **{name: getattr(client, name) for name in _CLIENT_FIELDS})
