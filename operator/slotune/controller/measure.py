"""The loop's MeasurementSource on Kubernetes: one window of the TunedModel's runtime pods, read from Prometheus.

Windows never overlap and never start before the warm-up after the last change has passed (the first requests after
a restart are several times slower, reference.md section 2). `measure` never waits: before the window is over it
raises the loop's `WindowOpen` with the time it ends, and once over the window is read over exactly the interval it
covered, however late the tick that reads it. Too few finished requests, no series, or Prometheus down all raise
the loop's `MetricsUnavailable`; the reason is kept in `last_reason` for the MetricsAvailable condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from slotune.api import TunedModel
from slotune.loop.protocols import WindowOpen
from slotune.metrics.names import names_for
from slotune.metrics.promql import Selector, promql_snapshot
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from slotune.resources import ChildNames
from slotune.settings import OperatorSettings
from slotune.snapshot import MetricsSnapshot


class PromQLSource:
    def __init__(self, tm: TunedModel, settings: OperatorSettings, changed_at_s: Callable[[], float],
                 clock: Callable[[], float] = time.time) -> None:
        """`changed_at_s`: when the running config last changed (unix s)."""
        self.url = settings.prometheus_url
        self.names = names_for(tm.spec.runtime.engine.value)
        self.selector = Selector(namespace=tm.metadata.namespace, deployment=ChildNames(tm.metadata.name).deployment,
                                 model=tm.spec.model.name)
        self.tuning = tm.spec.tuning
        self._changed_at_s = changed_at_s
        self._clock = clock
        self.last_end_s = clock()  # a fresh operator measures from now on, never data it did not watch
        self.last_reason: UnavailableReason | None = None

    def window_end_s(self, window_s: float) -> float:
        start = max(self._changed_at_s() + self.tuning.warmup_s, self.last_end_s)
        return start + window_s

    def measure(self, window_s: float) -> MetricsSnapshot:
        if not self.url:
            self.last_reason = None
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE,
                                     "no Prometheus configured (SLOTUNE_PROMETHEUS_URL is empty)")
        end_s = self.window_end_s(window_s)
        if self._clock() < end_s:
            raise WindowOpen(end_s)
        self.last_end_s = end_s
        try:
            snapshot = promql_snapshot(self.url, self.names, self.selector, window_s, at_s=end_s,
                                       min_requests=self.tuning.min_samples)
        except MetricsUnavailable as error:
            self.last_reason = error.reason
            raise
        self.last_reason = None
        return snapshot
