"""Windows read once for every TunedModel they belong to: the operator's PromQL load grows with namespaces, not
with TunedModels.

Each TunedModel's window ends on a common grid (`align_end_s`), so the windows of many TunedModels in a namespace end
at the same instant. The first tick that needs such a window reads every deployment of the namespace with one set of
grouped queries (`slotune.metrics.promql.fleet_readings`); the ticks that need the same window later, or meanwhile on
another worker thread, take their deployment's readings from that one answer. An answer is kept for two windows,
then dropped. An outage is shared the same way: one failed read answers the whole group for that window.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from slotune.metrics.names import MetricNames
from slotune.metrics.promql import GroupKey, fleet_readings
from slotune.metrics.window import WindowReadings

Readings = dict[GroupKey, WindowReadings]


def align_end_s(earliest_end_s: float, grid_s: float) -> float:
    """The first grid instant at or after `earliest_end_s` (unix seconds)."""
    return math.ceil(earliest_end_s / grid_s) * grid_s


@dataclass(frozen=True)
class WindowKey:
    url: str
    engine: str  # whose metric names the read uses
    namespace: str
    window_s: float
    end_s: float


class SharedWindows:
    def __init__(self, read: Callable[[str, MetricNames, str, float, float], Readings] = fleet_readings,
                 clock: Callable[[], float] = time.time) -> None:
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: dict[WindowKey, Future[Readings]] = {}
        self.reads = 0  # grouped reads made (each is one set of PromQL queries)

    def readings(self, key: WindowKey, names: MetricNames) -> Readings:
        """Every deployment's readings of the window `key` names (`names`: the engine's metric names); raises what
        the read raised."""
        with self._lock:
            self._forget_old()
            answer = self._answers.get(key)
            mine = answer is None
            if mine:
                answer = self._answers[key] = Future()
                self.reads += 1
        assert answer is not None
        if mine:
            try:
                answer.set_result(self._read(key.url, names, key.namespace, key.window_s, key.end_s))
            except Exception as error:
                answer.set_exception(error)
        return answer.result()

    def _forget_old(self) -> None:
        now = self._clock()
        for key in [k for k in self._answers if k.end_s + 2 * k.window_s < now]:
            del self._answers[key]
