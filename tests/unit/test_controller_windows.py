"""Windows that end together are read once: the first tick reads every deployment, the others share the answer.

The read function here counts its calls and blocks until released, to make concurrent callers meet on demand (a
timing the real Prometheus read cannot be made to produce); the grouped PromQL itself is tested against a real
Prometheus in tests/integration/test_measurement_promql.py.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from slotune.controller.windows import SharedWindows, WindowKey, align_end_s
from slotune.metrics.names import names_for
from slotune.metrics.window import MetricsUnavailable, UnavailableReason, WindowReadings

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

    def read(url, names, namespace, window_s, end_s):
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

    def read(url, names, namespace, window_s, end_s):
        calls.append(end_s)
        raise MetricsUnavailable(UnavailableReason.UNREACHABLE, "connection refused")

    windows = SharedWindows(read, clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(MetricsUnavailable):
            windows.readings(_key(990.0), NAMES)
    assert calls == [990.0]
    now[0] = 990.0 + 2 * 60.0 + 1  # two windows later the answer is gone: a new read
    with pytest.raises(MetricsUnavailable):
        windows.readings(_key(990.0), NAMES)
    assert calls == [990.0, 990.0]
