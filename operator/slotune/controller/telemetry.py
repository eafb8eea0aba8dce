"""The operator's own metrics: how late each TunedModel's tick runs, how many run and fail, what they cost.

Served on `settings.metrics_port` (off at 0) in Prometheus' text format next to the API-request and PromQL-query
counters the client modules keep (slotune_operator_api_requests_total, slotune_operator_promql_queries_total), so the
scale of one operator replica is watched the way the runtimes are.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# Seconds: fine between 1 and 10 s, where issue 15's bar (10% of a 60 s window: 6 s) falls.
LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 30.0, 60.0,
                 120.0)

TICK_LAG = Histogram("slotune_operator_tick_lag_seconds", "How long after its scheduled time a tick started",
                     buckets=LAG_BUCKETS_S)
TICK_DURATION = Histogram("slotune_operator_tick_duration_seconds", "Time one tick took on its worker",
                          buckets=LAG_BUCKETS_S)
TICK_FAILURES = Counter("slotune_operator_tick_failures", "Ticks that raised (reported and retried)")
WINDOW_READ_DELAY = Histogram("slotune_operator_window_read_delay_seconds",
                              "From a window's end until its grouped read of the namespace answered",
                              buckets=LAG_BUCKETS_S)
# Why a read answers late: how long it queued for a reader thread, and how long its queries took once sent.
WINDOW_READ_QUEUED = Histogram("slotune_operator_window_read_queued_seconds",
                               "How long a grouped window read waited for a free reader thread", buckets=LAG_BUCKETS_S)
WINDOW_READ_DURATION = Histogram("slotune_operator_window_read_duration_seconds",
                                 "How long a grouped window read's PromQL queries took", buckets=LAG_BUCKETS_S)
# Every daemon, watch event and deletion is handled on kopf's one event loop: a busy loop delays them all.
EVENT_LOOP_LAG = Histogram("slotune_operator_event_loop_lag_seconds",
                           "How late a 0.5 s sleep on the operator's event loop woke", buckets=LAG_BUCKETS_S)
# A full collection stops every thread (the event loop too); with a heap of a thousand TunedModels it is long.
GC_PAUSE = Histogram("slotune_operator_gc_pause_seconds",
                     "How long one garbage collection of the oldest generation took", buckets=LAG_BUCKETS_S)
# A tick that finds its window's read still in flight holds a worker for nothing (windows.py's patience).
TICKS_READ_IN_FLIGHT = Counter("slotune_operator_ticks_read_in_flight",
                               "Ticks that found their window's read in flight")
# What each tick left to wait for: a window's end ("window"), nothing known, polled again soon ("poll"); and how many
# ticks also looked at the children (the LOOK_S look: a Secret to rotate, readiness).
TICKS = Counter("slotune_operator_ticks", "Ticks by what the next one waits for", ["next"])
TICKS_LOOKED = Counter("slotune_operator_ticks_looked", "Ticks that also looked at the children")
DAEMONS = Gauge("slotune_operator_tunedmodels", "TunedModels whose tuning daemon runs")


def serve(port: int) -> None:
    watch_gc()
    if port:
        start_http_server(port)


_gc_started = [0.0]


def _gc_timed(phase: str, info: dict[str, int]) -> None:
    if info.get("generation") != 2:
        return
    if phase == "start":
        _gc_started[0] = time.monotonic()
    else:
        GC_PAUSE.observe(time.monotonic() - _gc_started[0])


def watch_gc() -> None:
    if _gc_timed not in gc.callbacks:
        gc.callbacks.append(_gc_timed)
