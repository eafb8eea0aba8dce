"""Windows read once for every TunedModel they belong to, spread over the window: the operator's PromQL load and
its ticks grow with TunedModels evenly in time, never as one read and a stampede of ticks.

Each TunedModel's window ends on a grid (`grid_s`) shifted by its own phase (`phase_s`, from a hash of its name):
the ends of many TunedModels in a namespace fall on a few shared instants, and their TunedModels are spread evenly
over those instants. A tick that sees its window still open says which window it waits for (`want`); the first tick
after the window's end starts one set of grouped queries for exactly the deployments waiting for that instant
(`slotune.metrics.promql.fleet_readings` with a regex on `deployment`), and the other ticks of that instant take
their readings from that one answer. Every TunedModel registers for its window before it ends (a late one for its
next instant still to come, measure.py), so an instant costs one read whatever the ticks' lag; a tick that wanted the
instant too late to be in a read in flight (a race at the instant itself) starts a read of those left out. An answer
is kept for two windows, then dropped. An outage is shared the same way: one failed read answers its group.

The grid follows the namespace's size (its live members, `join`): as fine as a tick for a few TunedModels, so a
window starts right after a change's warm-up; up to one window as the namespace grows, with the TunedModels' phases
spread over it (`PHASES` instants). At 1,000 TunedModels one instant ending every namespace's windows made one read
of 1,000 deployments (up to 60 s on the loaded 2-core machine) and then 1,000 ticks at once, each waiting for the
API server through 8 workers: tick lag p99 60 s. Spread, an instant holds ~1/PHASES of them. The price at scale: a
window after a change starts up to one window later.

Reads run on their own threads (`READERS`), never on a tick's worker: a tick that finds its window's read still in
flight waits at most `patience_s`, then raises the loop's WindowOpen with when to look again, and its worker goes
on to the next tick.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from slotune.controller import telemetry
from slotune.loop.protocols import WindowOpen
from slotune.metrics.names import MetricNames
from slotune.metrics.promql import GroupKey, fleet_readings
from slotune.metrics.window import WindowReadings

Readings = dict[GroupKey, WindowReadings]
# Read = (url, names, namespace, window_s, end_s, deployments): deployments None reads the whole namespace.
Read = Callable[[str, MetricNames, str, float, float, frozenset[str] | None], Readings]
DEPLOYMENTS_PER_WINDOW = 200  # a namespace this large has its windows' ends spread over a whole window
PHASES = 15  # distinct instants a window's ends are spread over at most (each a grouped read, ~30 queries)
READERS = 2  # grouped reads in flight toward Prometheus, at most


def align_end_s(earliest_end_s: float, grid_s: float, phase_s: float = 0.0) -> float:
    """The first instant of the grid shifted by `phase_s` at or after `earliest_end_s` (unix seconds)."""
    return phase_s + math.ceil((earliest_end_s - phase_s) / grid_s) * grid_s


def grid_s(window_s: float, tick_s: float, deployments: int = 0) -> float:
    """The grid that windows of `window_s` end on in a namespace of `deployments` (0: not known yet): a tick (at
    least a second) for a few, one window for DEPLOYMENTS_PER_WINDOW and more, a whole fraction of it between."""
    fine = max(1.0, tick_s)
    reads = max(1, min(math.floor(window_s / fine), DEPLOYMENTS_PER_WINDOW // max(1, deployments)))
    return max(fine, window_s / reads)


def phase_s(name: str, grid: float, tick_s: float) -> float:
    """This TunedModel's shift of the grid: one of at most PHASES instants a tick or more apart, by a hash of its
    name (stable across operator restarts, so a restart does not bunch the windows up again)."""
    slots = max(1, min(PHASES, math.floor(grid / max(1.0, tick_s))))
    return (zlib.crc32(name.encode()) % slots) * grid / slots


@dataclass(frozen=True)
class WindowKey:
    url: str
    engine: str  # whose metric names the read uses
    namespace: str
    window_s: float
    end_s: float


@dataclass(frozen=True)
class _Read:
    covers: frozenset[str] | None  # the deployments read (None: the whole namespace)
    answer: Future[Readings]
    started: float  # monotonic


class SharedWindows:
    def __init__(self, read: Read | None = None, clock: Callable[[], float] = time.time,
                 patience_s: float | None = None, retry_s: float = 2.0,
                 monotonic: Callable[[], float] = time.monotonic, readers: Executor | None = None) -> None:
        """`patience_s`: how long a tick waits for a read in flight before it is told to come back (None: until
        the answer, as a single caller wants); `retry_s`: the soonest it is told to come back; `readers`: where reads
        run (default: READERS threads of their own); `read`: default, PromQL that `close` ends between queries."""
        self._closing = threading.Event()
        self._read = read or functools.partial(fleet_readings, stop=self._closing)
        self._clock = clock
        self._monotonic = monotonic
        self._patience_s = patience_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._reads: dict[WindowKey, list[_Read]] = {}
        self._wanted: dict[WindowKey, set[str]] = {}  # deployments waiting for each window
        self._took_s: dict[tuple[str, str], float] = {}  # (url, namespace) -> how long its last read took
        self._answered: dict[WindowKey, float] = {}  # when each window's last read answered (monotonic)
        self._members: dict[tuple[str, str], weakref.WeakSet[object]] = {}  # (url, namespace) -> live readers
        self._readers = readers or ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="slotune-promql")
        self.reads = 0  # grouped reads made (each is one set of PromQL queries)

    def close(self) -> None:
        """Queued reads are dropped and a read in flight ends before its next query (the interpreter's exit waits
        for the reader threads)."""
        self._closing.set()
        self._readers.shutdown(wait=False, cancel_futures=True)

    def join(self, url: str, namespace: str, member: object) -> None:
        """`member` reads this namespace's windows (until it is garbage): the namespace's size is known before its
        first read answers. Without it, a thousand new TunedModels all chose the tick grid for their first window."""
        with self._lock:
            self._members.setdefault((url, namespace), weakref.WeakSet()).add(member)

    def grid_s(self, url: str, namespace: str, window_s: float, tick_s: float) -> float:
        """The grid this namespace's windows end on now: `grid_s` at its number of live members."""
        with self._lock:
            return grid_s(window_s, tick_s, len(self._members.get((url, namespace), ())))

    def want(self, key: WindowKey, deployment: str) -> None:
        """`deployment` will read the window `key` names: the read of that instant includes it."""
        with self._lock:
            self._wanted.setdefault(key, set()).add(deployment)

    def readings(self, key: WindowKey, names: MetricNames, deployment: str | None = None) -> Readings:
        """The readings of the window `key` names for `deployment` and the others read with it (None: every
        deployment of the namespace); raises what the read raised, or WindowOpen (come back then) while the read is
        still in flight after `patience_s`."""
        read = self._read_of(key, names, deployment)
        try:
            return read.answer.result(timeout=self._patience_s)
        except FutureTimeout:
            telemetry.TICKS_READ_IN_FLIGHT.inc()
            raise WindowOpen(self._clock() + self._come_back_s(key, read)) from None

    def answer(self, key: WindowKey, names: MetricNames, deployment: str | None = None) -> Future[Readings]:
        """The read of the window `key` names that covers `deployment`, started if none is: the operator's daemon
        awaits it on the event loop, so the tick that takes the readings takes a worker once, when they are in."""
        return self._read_of(key, names, deployment).answer

    def _read_of(self, key: WindowKey, names: MetricNames, deployment: str | None) -> _Read:
        with self._lock:
            self._forget_old()
            reads = self._reads.setdefault(key, [])
            read = next((r for r in reads if r.covers is None or (deployment is not None and deployment in r.covers)),
                        None)
            if read is None:
                covers = None
                if deployment is not None:
                    wanted = self._wanted.setdefault(key, set())
                    wanted.add(deployment)
                    done = set().union(*(r.covers or () for r in reads))
                    covers = frozenset(wanted - done)
                queued = time.monotonic()
                read = _Read(covers, self._readers.submit(self._timed_read, key, names, covers, queued), queued)
                reads.append(read)
                self.reads += 1
            return read

    def _timed_read(self, key: WindowKey, names: MetricNames, covers: frozenset[str] | None,
                    queued: float) -> Readings:
        started = time.monotonic()
        telemetry.WINDOW_READ_QUEUED.observe(started - queued)
        try:
            return self._read(key.url, names, key.namespace, key.window_s, key.end_s, covers)
        finally:
            took = time.monotonic() - started
            with self._lock:
                self._took_s[(key.url, key.namespace)] = took
                self._answered[key] = self._monotonic()
            telemetry.WINDOW_READ_DURATION.observe(took)
            telemetry.WINDOW_READ_DELAY.observe(max(0.0, self._clock() - key.end_s))

    def _come_back_s(self, key: WindowKey, read: _Read) -> float:
        """When the read in flight should be done, judging by the namespace's last read; a tick at least."""
        with self._lock:
            took = self._took_s.get((key.url, key.namespace), 0.0)
        return max(self._retry_s, read.started + took - time.monotonic())

    def _forget_old(self) -> None:
        now, monotonic = self._clock(), self._monotonic()
        # A read still in flight is never dropped: the next tick would queue the same read again behind it. Nor is
        # an answer younger than two windows, however old its window: a tick that reads a window long after its end
        # (created in a burst, its first ticks late) comes back for the answer after the read, and finding it
        # dropped it read again, and again (at 500 TunedModels 20 of them looped so, 54,000 queries in 20 min).
        for key in [k for k, reads in self._reads.items()
                    if k.end_s + 2 * k.window_s < now and all(r.answer.done() for r in reads)
                    and monotonic - self._answered.get(k, monotonic) > 2 * k.window_s]:
            del self._reads[key]
            self._wanted.pop(key, None)
            self._answered.pop(key, None)
        for key in [k for k in self._wanted if k.end_s + 2 * k.window_s < now and k not in self._reads]:
            del self._wanted[key]
