"""Windows read once for every TunedModel they belong to: the operator's PromQL load grows with namespaces, not
with TunedModels.

Each TunedModel's window ends on a common grid (`align_end_s`, `grid_s`), so the windows of many TunedModels in a
namespace end at the same instant. The first tick that needs such a window starts one set of grouped queries for
every deployment of the namespace (`slotune.metrics.promql.fleet_readings`); the ticks that need the same window
later, or meanwhile on another worker thread, take their deployment's readings from that one answer. An answer is
kept for two windows, then dropped. An outage is shared the same way: one failed read answers the whole group.

The grid follows the namespace's size (`grid_s`): a grouped read returns every deployment of the namespace, so the
number of distinct window ends is what a window's reads cost. With 1,000 TunedModels created over minutes, a 2 s
grid gave ~30 ends per window, each a read of 1,000 deployments (24 s on the loaded 2-core machine, several of them
Prometheus CPU): the reads never caught up. The grid is as fine as a tick while a window's reads fetch at most
`DEPLOYMENTS_PER_WINDOW` deployment readings, and coarsens up to one window as the namespace grows (the size is
that of the namespace's last read), so a few TunedModels keep windows that start right after a change's warm-up,
and a thousand share one read a window. The price at scale: a window after a change starts up to one window later.

Reads run on their own threads (`READERS`), never on a tick's worker: a read of a thousand deployments takes seconds
(tens of seconds on a loaded machine), and ticks blocked on it would hold every worker and delay every other
TunedModel's tick. A tick that finds its window's read still in flight waits at most `patience_s`, then raises the
loop's WindowOpen with when to look again, and its worker goes on to the next tick.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from slotune.controller import telemetry
from slotune.loop.protocols import WindowOpen
from slotune.metrics.names import MetricNames
from slotune.metrics.promql import GroupKey, fleet_readings
from slotune.metrics.window import WindowReadings

Readings = dict[GroupKey, WindowReadings]
DEPLOYMENTS_PER_WINDOW = 200  # deployment readings a namespace's reads fetch per window before its grid coarsens
READERS = 2  # grouped reads in flight toward Prometheus, at most


def align_end_s(earliest_end_s: float, grid_s: float) -> float:
    """The first grid instant at or after `earliest_end_s` (unix seconds)."""
    return math.ceil(earliest_end_s / grid_s) * grid_s


def grid_s(window_s: float, tick_s: float, deployments: int = 0) -> float:
    """The grid that windows of `window_s` end on in a namespace of `deployments` (0: not known yet): a tick (at
    least a second) for a few, one window for DEPLOYMENTS_PER_WINDOW and more, a whole fraction of it between."""
    fine = max(1.0, tick_s)
    reads = max(1, min(math.floor(window_s / fine), DEPLOYMENTS_PER_WINDOW // max(1, deployments)))
    return max(fine, window_s / reads)


@dataclass(frozen=True)
class WindowKey:
    url: str
    engine: str  # whose metric names the read uses
    namespace: str
    window_s: float
    end_s: float


class SharedWindows:
    def __init__(self, read: Callable[[str, MetricNames, str, float, float], Readings] = fleet_readings,
                 clock: Callable[[], float] = time.time, patience_s: float | None = None,
                 retry_s: float = 2.0) -> None:
        """`patience_s`: how long a tick waits for a read in flight before it is told to come back (None: until
        the answer, as a single caller wants); `retry_s`: the soonest it is told to come back."""
        self._read = read
        self._clock = clock
        self._patience_s = patience_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._answers: dict[WindowKey, Future[Readings]] = {}
        self._started: dict[WindowKey, float] = {}  # when each read in flight started (monotonic)
        self._took_s: dict[tuple[str, str], float] = {}  # (url, namespace) -> how long its last read took
        self._sizes: dict[tuple[str, str], int] = {}  # (url, namespace) -> deployments its last read returned
        self._members: dict[tuple[str, str], weakref.WeakSet[object]] = {}  # (url, namespace) -> live readers
        self._readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="slotune-promql")
        self.reads = 0  # grouped reads made (each is one set of PromQL queries)

    def close(self) -> None:
        self._readers.shutdown(wait=False, cancel_futures=True)

    def join(self, url: str, namespace: str, member: object) -> None:
        """`member` reads this namespace's windows (until it is garbage): the namespace's size is known before its
        first read answers. Without it, a thousand new TunedModels all chose the tick grid for their first window,
        and ~50 reads of the whole namespace queued behind each other for longer than the windows lasted."""
        with self._lock:
            self._members.setdefault((url, namespace), weakref.WeakSet()).add(member)

    def grid_s(self, url: str, namespace: str, window_s: float, tick_s: float) -> float:
        """The grid this namespace's windows end on now: `grid_s` at the larger of its members and its last read."""
        with self._lock:
            size = max(self._sizes.get((url, namespace), 0), len(self._members.get((url, namespace), ())))
            return grid_s(window_s, tick_s, size)

    def readings(self, key: WindowKey, names: MetricNames) -> Readings:
        """Every deployment's readings of the window `key` names (`names`: the engine's metric names); raises what
        the read raised, or WindowOpen (come back then) while the read is still in flight after `patience_s`."""
        with self._lock:
            self._forget_old()
            answer = self._answers.get(key)
            if answer is None:
                self._started[key] = time.monotonic()
                answer = self._answers[key] = self._readers.submit(self._timed_read, key, names)
                self.reads += 1
        try:
            return answer.result(timeout=self._patience_s)
        except FutureTimeout:
            raise WindowOpen(self._clock() + self._come_back_s(key)) from None

    def _timed_read(self, key: WindowKey, names: MetricNames) -> Readings:
        try:
            found = self._read(key.url, names, key.namespace, key.window_s, key.end_s)
            with self._lock:
                self._sizes[(key.url, key.namespace)] = len(found)
            return found
        finally:
            with self._lock:
                started = self._started.pop(key, None)
                if started is not None:
                    self._took_s[(key.url, key.namespace)] = time.monotonic() - started
            telemetry.WINDOW_READ_DELAY.observe(max(0.0, self._clock() - key.end_s))

    def _come_back_s(self, key: WindowKey) -> float:
        """When the read in flight should be done, judging by the namespace's last read; a tick at least."""
        with self._lock:
            started = self._started.get(key, time.monotonic())
            took = self._took_s.get((key.url, key.namespace), 0.0)
        return max(self._retry_s, started + took - time.monotonic())

    def _forget_old(self) -> None:
        now = self._clock()
        # A read still in flight is never dropped: the next tick would queue the same read again behind it.
        for key in [k for k, a in self._answers.items() if k.end_s + 2 * k.window_s < now and a.done()]:
            del self._answers[key]
