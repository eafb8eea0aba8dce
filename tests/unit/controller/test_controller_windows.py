"""Windows that end together are read once: the first tick reads every deployment, the others share the answer.

The read function here counts its calls and blocks until released, to make concurrent callers meet on demand (a
timing the real Prometheus read cannot be made to produce); the grouped PromQL itself is tested against a real
Prometheus in tests/integration/test_measurement_promql.py.
"""

from __future__ import annotations

import http.server
import json
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from slotune.api import parse_tunedmodel
from slotune.controller.measure import PromQLSource
from slotune.controller.windows import PHASES, SharedWindows, WindowKey, align_end_s, grid_s, phase_s
from slotune.loop.protocols import WindowOpen
from slotune.metrics.names import names_for
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, WindowReadings
from slotune.settings import OperatorSettings
from tests.unit.api_cases import BASE

NAMES = names_for("builtin")


def _key(end_s: float, namespace: str = "team-a") -> WindowKey:
    return WindowKey("http://prometheus:9090", "builtin", namespace, 60.0, end_s)


def test_window_ends_fall_on_a_shared_grid() -> None:
    assert align_end_s(1000.1, 2.0) == 1002.0
    assert align_end_s(1002.0, 2.0) == 1002.0
    ends = {align_end_s(start + 60.0, 2.0) for start in (1000.1, 1000.4, 1001.9)}
    assert ends == {1062.0}  # three TunedModels that started apart read one window


def test_concurrent_ticks_for_one_window_make_one_read() -> None:
    release, calls = threading.Event(), []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        calls.append((namespace, end_s))
        release.wait(10)
        return {("a-runtime", "m"): WindowReadings(window_s=window_s, num_requests=7)}

    windows = SharedWindows(read, clock=lambda: 1000.0)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(windows.readings, _key(990.0), NAMES) for _ in range(8)]
        release.set()
        answers = [f.result() for f in futures]
    assert calls == [("team-a", 990.0)] and windows.reads == 1
    assert all(a[("a-runtime", "m")].num_requests == 7 for a in answers)
    windows.readings(_key(990.0, namespace="team-b"), NAMES)  # another namespace is another read
    windows.readings(_key(992.0), NAMES)  # and so is the next window
    assert windows.reads == 3


def test_a_failed_read_answers_its_group_and_old_answers_are_dropped() -> None:
    calls, now = [], [1000.0]

    def read(url, names, namespace, window_s, end_s, deployments=None):
        calls.append(end_s)
        raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "connection refused")

    windows = SharedWindows(read, clock=lambda: now[0], monotonic=lambda: now[0])
    for _ in range(3):
        with pytest.raises(MetricsUnavailable):
            windows.readings(_key(990.0), NAMES)
    assert calls == [990.0]
    now[0] = 1000.0 + 2 * 60.0 + 1  # two windows after it answered the answer is gone: a new read
    with pytest.raises(MetricsUnavailable):
        windows.readings(_key(990.0), NAMES)
    assert calls == [990.0, 990.0]


def test_the_grid_coarsens_with_the_namespace_so_a_window_costs_one_read_of_a_large_fleet() -> None:
    assert grid_s(60.0, 2.0) == 2.0  # size not known yet, or a few TunedModels: a tick
    assert grid_s(60.0, 2.0, deployments=10) == 3.0
    assert grid_s(60.0, 2.0, deployments=100) == 30.0
    assert grid_s(60.0, 2.0, deployments=1000) == 60.0
    assert grid_s(5.0, 2.0, deployments=40) == 2.5
    starts = [1000.0 + 0.5 * i for i in range(120)]  # TunedModels created over a minute
    ends = {align_end_s(start + 60.0, grid_s(60.0, 2.0, deployments=1000)) for start in starts}
    assert len(ends) <= 2  # the tick grid would make 30 reads of the whole namespace


def test_phases_spread_a_large_namespace_over_the_window_and_each_instant_reads_only_its_deployments() -> None:
    """1,000 TunedModels: their window ends fall on PHASES instants of the window, evenly, and the read of an
    instant asks Prometheus for the deployments waiting for it only (one read of all 1,000 at one instant, then
    1,000 ticks at once, was tick lag p99 60 s)."""
    grid = grid_s(60.0, 2.0, deployments=1000)
    names = [f"tm{i:04d}-runtime" for i in range(1000)]
    ends = Counter(align_end_s(1000.0 + 60.0, grid, phase_s(name, grid, 2.0)) for name in names)
    assert len(ends) == PHASES and max(ends.values()) < 2 * 1000 / PHASES  # spread, none holds twice its share
    assert all(1060.0 <= end < 1120.0 for end in ends)
    assert {phase_s(name, 2.0, 2.0) for name in names} == {0.0}  # a few TunedModels: the tick grid, no shift
    calls = []

    def read(url, names_, namespace, window_s, end_s, deployments=None):
        calls.append(deployments)
        return {(d, "m"): WindowReadings(window_s=window_s, num_requests=3) for d in deployments or ()}

    windows = SharedWindows(read, clock=lambda: 1000.0)
    for d in ("a-runtime", "b-runtime"):
        windows.want(_key(990.0), d)
    windows.want(_key(994.0), "c-runtime")
    assert set(windows.readings(_key(990.0), NAMES, "a-runtime")) == {("a-runtime", "m"), ("b-runtime", "m")}
    windows.readings(_key(990.0), NAMES, "b-runtime")  # read with a's
    late = windows.readings(_key(990.0), NAMES, "d-runtime")  # wanted after the read started: one more read
    assert calls == [frozenset({"a-runtime", "b-runtime"}), frozenset({"d-runtime"})] and set(late) == {
        ("d-runtime", "m")}
    windows.close()


def test_a_tick_never_waits_out_a_read_in_flight() -> None:
    """A read of a thousand deployments takes seconds: the tick is told when to come back instead of holding its
    worker, and coming back finds the one read's answer."""
    release, calls = threading.Event(), []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        calls.append(end_s)
        release.wait(10)
        return {("a-runtime", "m"): WindowReadings(window_s=window_s, num_requests=7)}

    windows = SharedWindows(read, clock=lambda: 1000.0, patience_s=0.0, retry_s=2.0)
    for _ in range(3):
        with pytest.raises(WindowOpen) as open_window:
            windows.readings(_key(990.0), NAMES)
        assert open_window.value.ends_at_s >= 1002.0
    release.set()
    deadline = time.monotonic() + 30
    while True:
        try:
            answer = windows.readings(_key(990.0), NAMES)
            break
        except WindowOpen:
            assert time.monotonic() < deadline, "the read never answered"
            time.sleep(0.01)
    assert answer[("a-runtime", "m")].num_requests == 7 and calls == [990.0] and windows.reads == 1
    windows.close()


def test_a_window_whose_read_is_in_flight_is_the_window_read_next_tick() -> None:
    """The source must not move on to the next window while this one's read is still in flight (it would skip a
    window of measurements, and wait a whole window more)."""
    manifest = yaml.safe_load(BASE.read_text())
    manifest["metadata"] |= {"namespace": "team-a", "generation": 1}
    manifest["spec"].setdefault("tuning", {})["windowSeconds"] = 60
    tm = parse_tunedmodel(manifest)
    now, release, ends = [1000.0], threading.Event(), []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        ends.append(end_s)
        release.wait(10)
        return {}

    windows = SharedWindows(read, clock=lambda: now[0], patience_s=0.0)
    source = PromQLSource(tm, OperatorSettings(tick_s=2.0, prometheus_url="http://prometheus:9090"), lambda: 0.0,
                          windows, clock=lambda: now[0])
    end = source.window_end_s(60.0)
    now[0] = end + 1
    for _ in range(2):
        with pytest.raises(WindowOpen):
            source.measure(60.0)
        assert source.window_end_s(60.0) == end
    release.set()
    deadline = time.monotonic() + 30
    while True:
        try:
            source.measure(60.0)
        except WindowOpen:
            assert time.monotonic() < deadline, "the read never answered"
            time.sleep(0.01)
            continue
        except MetricsUnavailable:  # this fake Prometheus has no series for it: the window was read, and is over
            break
    assert ends == [end] and source.window_end_s(60.0) >= end + 60.0
    windows.close()


class _Member:
    """A reader of the namespace's windows (a PromQLSource in the operator)."""


def test_members_set_the_grid_before_any_read_and_a_read_in_flight_is_never_queued_twice() -> None:
    release, calls, now = threading.Event(), [], [1000.0]

    def read(url, names, namespace, window_s, end_s, deployments=None):
        calls.append(end_s)
        release.wait(10)
        return {}

    windows = SharedWindows(read, clock=lambda: now[0], patience_s=0.0)
    url = "http://prometheus:9090"
    members = [_Member() for _ in range(300)]
    for member in members:
        windows.join(url, "team-a", member)
    assert windows.grid_s(url, "team-a", 60.0, 2.0) == 60.0  # 300 readers known before any read
    with pytest.raises(WindowOpen):
        windows.readings(_key(990.0), NAMES)
    now[0] = 990.0 + 3 * 60.0  # the read outlived two windows: still in flight, so still the one answer
    with pytest.raises(WindowOpen):
        windows.readings(_key(990.0), NAMES)
    assert calls == [990.0] and windows.reads == 1
    release.set()
    windows.close()


def test_a_window_read_long_after_its_end_is_read_once() -> None:
    """A TunedModel whose first ticks ran late (created in a burst) reads a window ten windows old: its tick is told
    to come back while the read runs, and coming back finds the answer, not a dropped one to read again (20 of 500
    TunedModels looped so, a read per tick, and never measured a window)."""
    release, calls, now = threading.Event(), [], [1000.0]

    def read(url, names, namespace, window_s, end_s, deployments=None):
        calls.append(end_s)
        release.wait(10)
        return {("a-runtime", "m"): WindowReadings(window_s=window_s, num_requests=7)}

    windows = SharedWindows(read, clock=lambda: now[0], patience_s=0.0, monotonic=lambda: now[0])
    old = _key(1000.0 - 10 * 60.0)
    with pytest.raises(WindowOpen):
        windows.readings(old, NAMES, "a-runtime")
    release.set()
    deadline = time.monotonic() + 30
    while not windows._reads[old][0].answer.done():
        assert time.monotonic() < deadline, "the read never answered"
        time.sleep(0.01)
    now[0] += 2.0  # the tick comes back
    assert windows.readings(old, NAMES, "a-runtime")[("a-runtime", "m")].num_requests == 7
    assert calls == [old.end_s] and windows.reads == 1
    windows.close()


def _source(windows: SharedWindows, now: list[float], window_s: float = 60.0,
            quiet_since_s: Callable[[], float] = lambda: float("-inf")) -> PromQLSource:
    manifest = yaml.safe_load(BASE.read_text())
    manifest["metadata"] |= {"namespace": "team-a", "generation": 1}
    manifest["spec"].setdefault("tuning", {})["windowSeconds"] = window_s
    return PromQLSource(parse_tunedmodel(manifest), OperatorSettings(tick_s=2.0, prometheus_url="http://p:9090"),
                        lambda: 0.0, windows, clock=lambda: now[0], quiet_since_s=quiet_since_s)


def test_a_source_that_fell_behind_waits_for_its_next_instant_not_a_window_that_ended() -> None:
    """Created in a burst, its first tick ten windows late: no read of a window that already ended (its instant's
    read, made without it, would have to be made again for it alone); it registers for its next instant still to
    come, and that instant's one read answers it."""
    now, reads = [1000.0], []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        reads.append((end_s, deployments))
        return {}

    windows = SharedWindows(read, clock=lambda: now[0], monotonic=lambda: now[0])
    source = _source(windows, now)
    now[0] += 10 * 60.0 + 7.0
    with pytest.raises(WindowOpen) as open_window:
        source.measure(60.0)
    end = open_window.value.ends_at_s
    assert now[0] < end <= now[0] + 60.0 and reads == []
    now[0] = end + 45.0  # its next tick is late too: it reads the window it registered for, not a later one
    with pytest.raises(MetricsUnavailable):  # no series of it in this Prometheus: the window was read all the same
        source.measure(60.0)
    assert reads == [(end, frozenset({source.selector.deployment}))]
    now[0] += 0.5  # the next tick: the window after it follows on, and is still open
    with pytest.raises(WindowOpen) as open_window:
        source.measure(60.0)
    assert open_window.value.ends_at_s == end + 60.0 and len(reads) == 1
    windows.close()


def test_a_window_starts_after_slotunes_own_probe_requests_ended() -> None:
    """The quality gate probes a canary pod with its own prompts: the latency window judged next must not hold them.
    A window chosen before the probe ended is moot once it ends inside it; the next starts after it."""
    now, quiet = [1000.0], [float("-inf")]
    windows = SharedWindows(lambda *args, **kwargs: {}, clock=lambda: now[0], monotonic=lambda: now[0])
    source = _source(windows, now, quiet_since_s=lambda: quiet[0])
    with pytest.raises(WindowOpen) as open_window:
        source.measure(60.0)
    first_end = open_window.value.ends_at_s
    assert first_end - 60.0 < 1030.0
    now[0] = quiet[0] = 1030.0  # the probe set's last answer came back 30 s into that window
    with pytest.raises(WindowOpen) as open_window:
        source.measure(60.0)
    assert open_window.value.ends_at_s - 60.0 >= 1030.0 > first_end - 60.0
    windows.close()


def _named_source(windows: SharedWindows, now: list[float], name: str) -> PromQLSource:
    manifest = yaml.safe_load(BASE.read_text())
    manifest["metadata"] |= {"namespace": "team-a", "generation": 1, "name": name}
    manifest["spec"].setdefault("tuning", {})["windowSeconds"] = 60.0
    return PromQLSource(parse_tunedmodel(manifest), OperatorSettings(tick_s=2.0, prometheus_url="http://p:9090"),
                        lambda: 0.0, windows, clock=lambda: now[0])


class _SlowReaders(Executor):
    """Two reader threads on the test's clock: a read answers `took_s` after a reader took it from the queue."""

    def __init__(self, now: list[float], took_s: float, readers: int = 2) -> None:
        self.now, self.took_s = now, took_s
        self.free_at = [0.0] * readers
        self.queue: deque[tuple[Future, Any, tuple[Any, ...]]] = deque()
        self.running: list[tuple[float, Future, Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self.queue.append((future, fn, args))
        return future

    def advance(self) -> None:
        for i, free_at in enumerate(self.free_at):
            if free_at <= self.now[0] and self.queue:
                future, fn, args = self.queue.popleft()
                self.free_at[i] = self.now[0] + self.took_s
                self.running.append((self.free_at[i], future, fn, args))
        for item in [r for r in self.running if r[0] <= self.now[0]]:
            self.running.remove(item)
            _, future, fn, args = item
            try:
                future.set_result(fn(*args))
            except Exception as error:
                future.set_exception(error)


def test_a_fleet_whose_reads_answer_late_makes_one_read_per_instant() -> None:
    """300 TunedModels in one namespace created in a burst, their ticks up to 30 s late and each grouped read taking
    6 s on two reader threads (at 1,000 in the scale bench the reads queued, and answered over 120 s late): each
    window still costs one grouped read per instant of the spread grid, and every TunedModel measures its windows.
    Reading a window that had already ended made a read per late moment, covering only the TunedModels late at that
    same moment: more reads than the readers could answer, which made the next windows later still."""
    rng = random.Random(15)
    now, reads = [1000.0], []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        reads.append(end_s)
        return {(d, "llama-3.1-8b-instruct"): WindowReadings(window_s=window_s, num_requests=7)
                for d in deployments or ()}

    readers = _SlowReaders(now, took_s=6.0)
    windows = SharedWindows(read, clock=lambda: now[0], patience_s=0.0, monotonic=lambda: now[0], readers=readers)
    sources = [_named_source(windows, now, f"model-{i}") for i in range(300)]
    due = {i: now[0] + rng.uniform(0.0, 300.0) for i in range(len(sources))}  # a burst: first ticks up to 5 min late
    measured: Counter[int] = Counter()
    start = now[0]
    while now[0] < start + 300.0 + 10 * 60.0:
        readers.advance()
        for i in [i for i, at in due.items() if at <= now[0]]:
            try:
                sources[i].measure(60.0)
                measured[i] += 1
                due[i] = now[0] + rng.uniform(2.0, 30.0)
            except WindowOpen as open_window:
                due[i] = max(open_window.ends_at_s, now[0] + 2.0) + rng.uniform(0.0, 30.0)
        now[0] += 1.0
    steady = [end for end in reads if end > start + 300.0 + 2 * 60.0]  # once every first tick has come
    assert len(steady) > PHASES and len(readers.queue) <= 2, f"{len(reads)} reads, {len(readers.queue)} queued"
    assert len(set(steady)) == len(steady)  # one read per instant
    assert len(steady) <= PHASES * ((max(steady) - min(steady)) / 60.0 + 1)
    assert all(measured[i] >= 8 for i in range(len(sources)))  # every TunedModel measured (nearly) every window
    windows.close()


def test_a_late_window_whose_read_is_slow_stays_the_window_read_while_the_clock_moves_on() -> None:
    """The late window is chosen from the clock; its read outlasting several ticks must not move the source on to a
    window chosen from a later clock (each tick would start another read and none would be waited for)."""
    now, release, ends = [1000.0], threading.Event(), []

    def read(url, names, namespace, window_s, end_s, deployments=None):
        ends.append(end_s)
        release.wait(10)
        return {}

    windows = SharedWindows(read, clock=lambda: now[0], patience_s=0.0, monotonic=lambda: now[0])
    source = _source(windows, now, window_s=5.0)  # a small namespace: the grid is a tick, finer than the window
    now[0] += 100.0
    for _ in range(10):
        with pytest.raises(WindowOpen):
            source.measure(5.0)
        now[0] += 2.0
    release.set()
    deadline = time.monotonic() + 30
    while True:
        try:
            source.measure(5.0)
        except WindowOpen:
            assert time.monotonic() < deadline, "the read never answered"
            time.sleep(0.01)
            continue
        except MetricsUnavailable:
            break
    assert len(ends) == 1 and windows.reads == 1
    windows.close()


class _SlowPrometheus(http.server.BaseHTTPRequestHandler):
    """Answers every query with one series of deployment d, after DELAY_S; counts the queries."""

    DELAY_S = 0.1
    queries = 0

    def do_GET(self) -> None:
        type(self).queries += 1
        time.sleep(self.DELAY_S)
        body = json.dumps({"status": "success", "data": {"result": [
            {"metric": {"deployment": "d", "model_name": "m", "le": "1"}, "value": [0, "1"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_close_ends_a_read_in_flight_before_its_next_query() -> None:
    """On SIGTERM the interpreter joins the reader threads: a grouped read of ~30 queries on a loaded Prometheus
    finished first, and held the operator's exit past 10 s at 500 and 1,000 TunedModels."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowPrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    windows = SharedWindows(patience_s=0.0)
    key = WindowKey(url, "builtin", "team-a", 60.0, time.time() - 1.0)
    try:
        with pytest.raises(WindowOpen):
            windows.readings(key, NAMES, "d")
        deadline = time.monotonic() + 30
        while _SlowPrometheus.queries < 2:  # the read is under way
            assert time.monotonic() < deadline, "the read never started"
            time.sleep(0.01)
        windows.close()
        at_close = _SlowPrometheus.queries
        read = windows._reads[key][0]
        with pytest.raises(MetricsUnavailable, match="stopping"):
            read.answer.result(timeout=30)
        assert _SlowPrometheus.queries <= at_close + 1  # at most the query in flight at close
    finally:
        server.shutdown()
        server.server_close()
