"""Against a real Prometheus: a grouped read restricted to some deployments (one instant's share of a namespace whose
window ends are spread) returns exactly those, each with its own requests, and names are matched literally (a `.`
in a name is not a regex wildcard)."""

from __future__ import annotations

import time
from collections.abc import Callable

from slotune.metrics.names import names_for
from slotune.metrics.promql import fleet_readings
from tests.integration.test_measurement_promql import SCRAPE_INTERVAL_S, _serve
from tests.unit.metrics_fake_vllm import FakeVllm

FLAT_S = 16 * SCRAPE_INTERVAL_S


def test_a_read_of_some_deployments_returns_those_and_only_those(prometheus: Callable[..., object]) -> None:
    requests = {"a-runtime": 10, "b-runtime": 20, "c-runtime": 30, "d.e": 40, "dxe": 50}
    servers = {name: FakeVllm(model="fleet") for name in requests}
    served = {name: _serve(server) for name, server in servers.items()}
    try:
        for server in servers.values():
            server.finish(ttft_s=0.0005, e2e_s=0.001, prompt_tokens=1)  # every series exists before the window
        prom = prometheus(targets=[(f"127.0.0.1:{port}", {"namespace": "team", "deployment": name})
                                   for name, (_, port) in served.items()], scrape_interval_s=SCRAPE_INTERVAL_S)
        prom.wait_for_scrapes()
        # The window spans flat stretches of FLAT_S on both sides of the requests: increase() extrapolates a
        # window's sampled range to its edges by up to an interval or so at the window's average slope, an error of
        # about one scrape interval over the window's length (a 2 s window read 40 of 30 requests).
        started = time.time()
        time.sleep(FLAT_S)
        for name, count in requests.items():
            for _ in range(count):
                servers[name].finish(ttft_s=0.05, e2e_s=0.5, prompt_tokens=100, output_tokens=10)
        # Wait on progress, not a guess: until Prometheus holds every target's count after the requests (a busy
        # machine's scrapes lag).
        _wait_for_counts(prom, {name: 1 + count for name, count in requests.items()})
        time.sleep(FLAT_S)
        window_s = time.time() - started
        names = names_for("vllm")
        found = fleet_readings(prom.url, names, "team", window_s, time.time(),
                               deployments=frozenset({"a-runtime", "c-runtime", "d.e"}))
        assert set(found) == {("a-runtime", "fleet"), ("c-runtime", "fleet"), ("d.e", "fleet")}
        for (name, _), readings in found.items():
            # increase() extrapolates to the window's edges: each count within a few of its own, far from others'
            assert abs(readings.num_requests - requests[name]) < 5, (name, readings.num_requests)
        everyone = fleet_readings(prom.url, names, "team", window_s, time.time())
        assert {name for name, _ in everyone} == set(requests)
    finally:
        for httpd, _ in served.values():
            httpd.shutdown()
            httpd.server_close()


def _wait_for_counts(prom: object, wanted: dict[str, int], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        rows = prom.query('vllm:e2e_request_latency_seconds_count{namespace="team"}')  # type: ignore[attr-defined]
        seen = {row["metric"]["deployment"]: float(row["value"][1]) for row in rows}
        if all(seen.get(name) == count for name, count in wanted.items()):
            return
        time.sleep(SCRAPE_INTERVAL_S)
    raise TimeoutError(f"Prometheus never held every count: wanted {wanted}, saw {seen}")
