"""The loop's MeasurementSource on Kubernetes: one window of the TunedModel's runtime pods, read from Prometheus.

Windows never overlap and never start before the warm-up after the last change has passed (the first requests after
a restart are several times slower, docs/facts.md#flags). `measure` never waits: before the window is over it raises
the loop's `WindowOpen` with the time it ends, and once over the window is read over exactly the interval it
covered, however late the tick that reads it. A source that fell behind (its first ticks late in a burst of creates,
or the operator stalled) skips to the latest window that has ended: no window starts before now - 2 windows, and the
span it skipped is not measured. Reading each missed window in turn made one grouped read per missed window per
TunedModel (223 reads a window where 15 were due at 1,000 TunedModels), and the fleet never caught up. Once a
window's read is started the source stays on it until it answers, however long that takes: a window recomputed from
a clock that moved on would start another read every tick and never get an answer. No finished request, no series,
or Prometheus down all raise the loop's `MetricsUnavailable`; the reason is kept in `last_reason` for the
MetricsAvailable condition. A window with fewer requests than minSamples is returned all the same: the loop pools it
with the next windows of the same config (a slow config serves few requests a window, and one never judged is never
changed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from slotune.api import TunedModel
from slotune.controller.windows import SharedWindows, WindowKey, align_end_s, phase_s
from slotune.loop.protocols import WindowOpen
from slotune.metrics.names import names_for
from slotune.metrics.per_pod import ArmWindows, arm_windows
from slotune.metrics.promql import Selector, not_exposed
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, require_samples
from slotune.resources import ChildNames
from slotune.settings import OperatorSettings
from slotune.snapshot import MetricsSnapshot, Source


class PromQLSource:
    def __init__(self, tm: TunedModel, settings: OperatorSettings, changed_at_s: Callable[[], float],
                 windows: SharedWindows, clock: Callable[[], float] = time.time) -> None:
        """`changed_at_s`: when the running config last changed (unix s); `windows`: the operator's shared reads."""
        self.url = settings.prometheus_url
        self.engine = tm.spec.runtime.engine
        self.names = names_for(self.engine)
        self.namespace = tm.metadata.namespace or "default"
        self.selector = Selector(namespace=self.namespace, deployment=ChildNames(tm.metadata.name).deployment,
                                 model=tm.spec.model.name)
        self.tuning = tm.spec.tuning
        self.tick_s = settings.tick_s  # window ends fall on a shared grid (grid_s), so reads can be shared
        self._windows = windows
        windows.join(self.url, self.namespace, self)  # the namespace's size sets its window grid (windows.py)
        self._changed_at_s = changed_at_s
        self._clock = clock
        self.last_end_s = clock()  # a fresh operator measures from now on, never data it did not watch
        self.last_reason: UnavailableReason | None = None
        self._reading: tuple[float, float] | None = None  # (window_s, end_s) of the read in flight

    def window_end_s(self, window_s: float) -> float:
        settled_s = self._changed_at_s() + self.tuning.warmup_s
        if self._reading is not None and self._reading[0] == window_s and self._reading[1] - window_s >= settled_s:
            return self._reading[1]  # (a change since the read started makes that window moot)
        late = self._clock() - 2 * window_s  # a source behind skips to the latest window that has ended
        start = max(settled_s, self.last_end_s, late)
        grid = self._windows.grid_s(self.url, self.namespace, window_s, self.tick_s)
        return align_end_s(start + window_s, grid, phase_s(self.selector.deployment or "", grid, self.tick_s))

    def measure(self, window_s: float) -> MetricsSnapshot:
        if not self.url:
            self.last_reason = None
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE,
                                     "no Prometheus configured (SLOTUNE_PROMETHEUS_URL is empty)")
        end_s = self.window_end_s(window_s)
        if self._clock() < end_s:
            self._windows.want(self._key(window_s, end_s), self.selector.deployment or "")  # joins that instant's read
            raise WindowOpen(end_s)
        self._reading = (window_s, end_s)
        try:
            snapshot = self._read(window_s, end_s)  # WindowOpen while its read is in flight: this window, later
        except WindowOpen:
            raise
        except MetricsUnavailable as error:
            self._reading = None
            self.last_end_s = end_s
            self.last_reason = error.reason
            raise
        except BaseException:  # a fault: the next tick computes its window afresh (skipping if it fell behind)
            self._reading = None
            raise
        self._reading = None
        self.last_end_s = end_s
        self.last_reason = None
        return snapshot

    def _key(self, window_s: float, end_s: float) -> WindowKey:
        return WindowKey(self.url, self.engine.value, self.namespace, window_s, end_s)

    def arms(self, canary_pod: str) -> ArmWindows:
        """The window `measure` last returned, per arm of a canary: the canary pod, its siblings pooled."""
        return arm_windows(self.url, self.names, self.selector, canary_pod, self.tuning.window_s, self.last_end_s)

    def _read(self, window_s: float, end_s: float) -> MetricsSnapshot:
        deployment = self.selector.deployment or ""
        mine = (deployment, self.selector.model or "")
        readings = self._windows.readings(self._key(window_s, end_s), self.names, deployment).get(mine)
        if readings is None:
            raise not_exposed(self.names, self.selector, window_s)
        return require_samples(readings, 1).to_snapshot(Source.PROMETHEUS)
