"""The operator's one Prometheus client (prometheus-api-client's PrometheusConnect, without its retries) against a
real Prometheus: answers become (labels, value) rows, a query Prometheus refuses is a bug named with the query (not an
outage), a stopping operator sends nothing, and a Prometheus that drops the connection is MetricsUnavailable after one
attempt."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest

from slotune.metrics.promql import PrometheusClient
from slotune.metrics.window import MetricsUnavailable, UnavailableReason


def test_answers_errors_and_stop(prometheus: Callable[..., object]) -> None:
    prom = prometheus()
    stop = threading.Event()
    client = PrometheusClient(prom.url, stop=stop)
    try:
        rows = client.query('label_replace(vector(2), "who", "slotune", "", "")', at_s=time.time())
        assert rows == [({"who": "slotune"}, 2.0)]
        assert client.scalar("vector(1) > 2") is None
        with pytest.raises(ValueError, match=r"sum by \(\(le"):
            client.query("sum by ((le) (x")  # a parse error: 400, a bug in the query
        stop.set()
        with pytest.raises(MetricsUnavailable, match="stopping"):
            client.query("vector(1)")
    finally:
        client.close()


def test_a_prometheus_that_drops_the_connection_is_asked_once() -> None:
    """prometheus-api-client retries 3 times by default, backing off 1 + 2 + 4 s on the reader thread: the operator's
    client turns that off, so a broken Prometheus costs one attempt and says so (counted by the listening socket)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[int] = []

    def drop() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            connection.close()  # no answer at all

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    client = PrometheusClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(MetricsUnavailable) as raised:
            client.query("vector(1)")
    finally:
        client.close()
        listener.close()
        thread.join(timeout=10)
    assert raised.value.reason is UnavailableReason.UNREACHABLE
    assert len(accepted) == 1
