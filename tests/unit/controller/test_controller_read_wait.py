"""A tick takes a worker only when its window's readings are in: the daemon awaits the window's shared read on the
event loop. At 1,000 TunedModels each took three ticks a window, two of them only to find the read still in flight
(each holding a worker for the read's patience): 16 workers 90% busy, tick lag p99 10 s.

The read is a real SharedWindows read on its reader thread, held until the test releases it; the TuningRun is a
stand-in that notes, at each tick, whether its readings were in (the real one's step is tested elsewhere).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

import kopf
import yaml
from kopf._cogs.aiokits import aioenums

from slotune.controller import handlers
from slotune.controller.windows import SharedWindows, WindowKey
from slotune.metrics.names import names_for
from slotune.metrics.window import WindowReadings
from slotune.settings import OperatorSettings
from tests.unit.api_cases import BASE

FLEET = 20
KEY = WindowKey("http://prometheus:9090", "builtin", "team-a", 60.0, 1000.0)


class _Run:
    """A TuningRun whose window has ended: its readings come from the shared read of KEY."""

    runs: ClassVar[list[_Run]] = []
    windows: ClassVar[SharedWindows]

    def __init__(self, api: Any, tm: Any, settings: Any, windows: Any, clock: Any, status: Any) -> None:
        self.generation = tm.metadata.generation
        self.deployment = f"{tm.metadata.name}-runtime"
        self.asked = 0  # how often the daemon asked for the pending read
        self.ticks: list[bool] = []  # per tick: were the readings in?
        _Run.runs.append(self)

    def _answer(self) -> Future:
        return _Run.windows.answer(KEY, names_for("builtin"), self.deployment)

    def pending_read(self) -> Future | None:
        self.asked += 1
        answer = self._answer()
        return None if answer.done() else answer

    def tick(self) -> float:
        done = self._answer().done()
        self.ticks.append(done)
        return 3600.0 if done else 0.01  # in flight: the real tick says come back soon


def _body(i: int) -> kopf.Body:
    manifest = yaml.safe_load(BASE.read_text())
    manifest["metadata"] |= {"namespace": "team-a", "generation": 1, "uid": f"u-{i}", "name": f"model-{i}"}
    return kopf.Body(manifest)


def _fleet_memo(windows: SharedWindows, workers: int) -> kopf.Memo:
    """The operator's memo as the daemons see it, with `_Run` reading from `windows` (the runs list emptied)."""
    _Run.runs, _Run.windows = [], windows
    memo = kopf.Memo()
    memo.settings = OperatorSettings(tick_s=0.01, prometheus_url="http://prometheus:9090")
    memo.pool = ThreadPoolExecutor(max_workers=workers)
    memo.windows = windows
    memo.api = None
    return memo


def test_a_tick_takes_a_worker_only_once_its_windows_read_answered(monkeypatch) -> None:
    release, reads = threading.Event(), []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        reads.append(deployments)
        release.wait(30)
        return {(d, "m"): WindowReadings(window_s=window_s, num_requests=7) for d in deployments or ()}

    memo = _fleet_memo(SharedWindows(read, clock=lambda: 1001.0, patience_s=0.0), workers=2)
    monkeypatch.setattr(handlers, "TuningRun", _Run)
    for i in range(FLEET):  # each registered for the window before it ended (PromQLSource.measure does)
        _Run.windows.want(KEY, f"model-{i}-runtime")
    setter: aioenums.FlagSetter = aioenums.FlagSetter()
    stopped = aioenums.AsyncFlagWaiter(setter)

    async def scenario() -> None:
        daemons = [asyncio.create_task(handlers.tune(body=_body(i), memo=memo, stopped=stopped)) for i in range(FLEET)]
        deadline = time.monotonic() + 30
        # Progress: every daemon asked for its window's read, which is in flight.
        while len(_Run.runs) < FLEET or any(run.asked == 0 for run in _Run.runs) or not reads:
            assert time.monotonic() < deadline and not any(d.done() for d in daemons)
            await asyncio.sleep(0.01)
        in_flight = sum(len(run.ticks) for run in _Run.runs)
        release.set()
        while any(not run.ticks or not run.ticks[-1] for run in _Run.runs):  # progress: each ticked with readings
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        setter.set(kopf.DaemonStoppingReason.RESOURCE_DELETED)
        await asyncio.wait_for(asyncio.gather(*daemons), timeout=30)
        assert in_flight == 0  # no tick while the read was in flight

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        memo.pool.shutdown(wait=True)
        _Run.windows.close()
    assert all(run.ticks == [True] for run in _Run.runs), [run.ticks for run in _Run.runs]
    assert len(reads) == 1  # one shared read answered the fleet


def test_a_daemon_parses_its_spec_once_per_generation_not_every_tick(monkeypatch) -> None:
    """Parsing (pydantic validation of the whole TunedModel) runs on the event loop: on every tick of a thousand
    TunedModels it was 40% of the event loop's time in a py-spy profile. Ten ticks, one generation: one parse."""
    parses = []
    real_parse = handlers.parse

    def counted(body: Any) -> Any:
        parses.append(body)
        return real_parse(body)

    class _Ticking(_Run):
        def pending_read(self) -> Future | None:
            return None

        def tick(self) -> float:
            self.ticks.append(True)
            return 0.0

    memo = _fleet_memo(SharedWindows(lambda *args: {}, clock=lambda: 1001.0), workers=1)
    monkeypatch.setattr(handlers, "TuningRun", _Ticking)
    monkeypatch.setattr(handlers, "parse", counted)
    setter: aioenums.FlagSetter = aioenums.FlagSetter()
    stopped = aioenums.AsyncFlagWaiter(setter)

    async def scenario() -> None:
        daemon = asyncio.create_task(handlers.tune(body=_body(0), memo=memo, stopped=stopped))
        deadline = time.monotonic() + 30
        while not _Run.runs or len(_Run.runs[0].ticks) < 10:  # progress: ten ticks
            assert time.monotonic() < deadline and not daemon.done()
            await asyncio.sleep(0.01)
        setter.set(kopf.DaemonStoppingReason.RESOURCE_DELETED)
        await asyncio.wait_for(daemon, timeout=30)

    try:
        asyncio.run(scenario())
    finally:
        memo.pool.shutdown(wait=True)
        _Run.windows.close()
    assert len(_Run.runs) == 1 and len(parses) == 1
