"""The loop's MeasurementSource on Kubernetes: one window of the TunedModel's runtime pods, read from Prometheus.

Windows never overlap and never start before the warm-up after the last change has passed (the first requests after a
restart are several times slower, docs/facts.md#flags). `measure` never waits: before the window is over it raises the
loop's `WindowOpen` with the time it ends, and once over the window is read over exactly the interval it covered,
however late the tick that reads it. A window is chosen before it ends, never after: the source registers for it
(`SharedWindows.want`) so its instant's one grouped read includes it, and keeps it until that read answers, however late
its own ticks come. A source that fell behind (its first ticks late in a burst of creates, or the operator stalled)
skips to the next instant still to come; the span it skipped is not measured. Reading each missed window in turn made
one grouped read per missed window per TunedModel (223 reads a window where 15 were due at 1,000 TunedModels); reading
the latest window that had already ended made one read per late moment, covering only the TunedModels late at that same
moment (112 reads a window, answered over 120 s late on the two reader threads, and the fleet never caught up). No
finished request, no series, or Prometheus down all raise the loop's `MetricsUnavailable`; the reason is kept in
`last_reason` for the MetricsAvailable condition. A window with fewer requests than minSamples is returned all the same:
the loop pools it with the next windows of the same config (a slow config serves few requests a window, and one never
judged is never changed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from slotune.api import TunedModel
from slotune.controller.windows import Readings, SharedWindows, WindowKey, align_end_s, phase_s
from slotune.loop.protocols import WindowOpen
from slotune.manifests.resources import ChildNames
from slotune.metrics.names import names_for
from slotune.metrics.per_pod import ArmWindows, arm_windows
from slotune.metrics.promql import Selector, not_exposed
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, require_samples
from slotune.settings import OperatorSettings
from slotune.snapshot import MetricsSnapshot, Source

_AHEAD_S = 0.001  # a window chosen now ends after now, never at it (its read may have started)


class PromQLSource:
    def __init__(self, tm: TunedModel, settings: OperatorSettings, changed_at_s: Callable[[], float],
                 windows: SharedWindows, clock: Callable[[], float] = time.time,
                 quiet_since_s: Callable[[], float] = lambda: float("-inf")) -> None:
        """`changed_at_s`: when the running config last changed (unix s); `windows`: the operator's shared reads;
        `quiet_since_s`: when the last of slotune's own requests to the pods ended (the quality gate's probe set):
        a window starts after it, so the probe's prompts, not the workload's, never count in a latency window."""
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
        self._quiet_since_s = quiet_since_s
        self._clock = clock
        self.last_end_s = clock()  # a fresh operator measures from now on, never data it did not watch
        self.last_reason: UnavailableReason | None = None
        self._chosen: tuple[float, float] | None = None  # (window_s, end_s) registered for, until it is read

    def _settled_s(self) -> float:
        """The earliest a window may start: after the last change's warm-up and slotune's own last requests."""
        return max(self._changed_at_s() + self.tuning.warmup_s, self._quiet_since_s())

    def _still_chosen(self, window_s: float) -> bool:
        settled_s = self._settled_s()
        # (a change, or a probe that ended inside it, since it was chosen makes that window moot)
        return self._chosen is not None and self._chosen[0] == window_s and self._chosen[1] - window_s >= settled_s

    def pending(self) -> Future[Readings] | None:
        """The read of the window this source waits for, once that window has ended and while its answer is not in
        (started here if no tick started it): the daemon awaits it before the tick that takes the readings. None:
        nothing to wait for (no window chosen, still open, or answered)."""
        if not self.url or self._chosen is None or not self._still_chosen(self._chosen[0]):
            return None
        window_s, end_s = self._chosen
        if self._clock() < end_s:
            return None
        answer = self._windows.answer(self._key(window_s, end_s), self.names, self.selector.deployment or "")
        return None if answer.done() else answer

    def window_end_s(self, window_s: float) -> float:
        settled_s = self._settled_s()
        if self._still_chosen(window_s):
            assert self._chosen is not None
            return self._chosen[1]
        # The first instant still to come: a source behind joins its instant's read instead of starting its own.
        start = max(settled_s, self.last_end_s, self._clock() - window_s + _AHEAD_S)
        grid = self._windows.grid_s(self.url, self.namespace, window_s, self.tick_s)
        end_s = align_end_s(start + window_s, grid, phase_s(self.selector.deployment or "", grid, self.tick_s))
        self._chosen = (window_s, end_s)
        return end_s

    def measure(self, window_s: float) -> MetricsSnapshot:
        if not self.url:
            self.last_reason = None
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE,
                                     "no Prometheus configured (SLOTUNE_PROMETHEUS_URL is empty)")
        end_s = self.window_end_s(window_s)
        if self._clock() < end_s:
            self._windows.want(self._key(window_s, end_s), self.selector.deployment or "")  # joins that instant's read
            raise WindowOpen(end_s)
        try:
            snapshot = self._read(window_s, end_s)  # WindowOpen while its read is in flight: this window, later
        except WindowOpen:
            raise
        except MetricsUnavailable as error:
            self._chosen = None
            self.last_end_s = end_s
            self.last_reason = error.reason
            raise
        except BaseException:  # a fault: the next tick chooses its window afresh (skipping if it fell behind)
            self._chosen = None
            raise
        self._chosen = None
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
