"""The Prometheus client of the operator's window reads, side by side: prometheus-api-client (what the operator uses,
slotune.metrics.promql.PrometheusClient) against the hand-written httpx client it replaced (the same queries, the
same parsing), on the reads a 1,000-TunedModel fleet makes.

Real parts: Prometheus (Debian) scraping tests/harness/fleet.py's exporter for NUM_DEPLOYMENTS deployments in one
namespace, as bench/bench_operator_scale.py's fleet. At 1,000 TunedModels the operator spreads window ends over
INSTANTS_PER_WINDOW instants a window, each reading its own share of deployments in one grouped read (~30 queries);
this benchmark makes that read, alternating the two clients round by round in one process, and reports per read:
wall time and the calling thread's CPU time (where the client's own cost shows; Prometheus' time is in both),
and once per client the import time and the resident memory it adds.

    python -m bench.bench_promql_client              # 1,000 deployments, 20 rounds (about 3 min)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from slotune.metrics.names import names_for
from slotune.metrics.promql import PrometheusClient, PromQLReader, Selector
from slotune.metrics.window import MetricsUnavailable, UnavailableReason
from tests.harness.fleet import FleetExporter
from tests.harness.prometheus import Prometheus

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NUM_DEPLOYMENTS = 1000
INSTANTS_PER_WINDOW = 15  # bench/results/operator_scale.md: at most 15 grouped reads a window at 1,000
WINDOW_S = 60.0
NAMESPACE = "fleet"


class HttpxClient(PrometheusClient):
    """The client the operator had before prometheus-api-client: httpx, the same answers and errors."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s)
        self._stop = None

    def close(self) -> None:
        self._http.close()

    def query(self, promql: str, at_s: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": promql} | ({"time": f"{at_s:.3f}"} if at_s is not None else {})
        try:
            response = self._http.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as error:
            raise MetricsUnavailable(UnavailableReason.UNREACHABLE, str(error)) from error
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"PromQL {promql!r} failed: {body.get('error')}")
        return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]


def one_read(make_client, url: str, deployments: frozenset[str]) -> dict[str, float]:
    """One grouped window read as fleet_readings makes it (a client per read), timed."""
    names = names_for("vllm")
    wall, cpu = time.perf_counter(), time.thread_time()
    client = make_client(url)
    try:
        reader = PromQLReader(client, names, Selector(namespace=NAMESPACE, deployments=deployments),
                              ("deployment", names.model_label))
        found = reader.readings(WINDOW_S, time.time())
    finally:
        client.close()
    return {"wall_ms": (time.perf_counter() - wall) * 1e3, "cpu_ms": (time.thread_time() - cpu) * 1e3,
            "groups": len(found)}


def import_cost(module: str) -> dict[str, float]:
    """Import time and resident memory a fresh interpreter adds by importing `module` (and what it brings)."""
    code = ("import re, time\n"
            "def rss(): return int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
            f"before = rss(); t = time.perf_counter(); import {module}; took = time.perf_counter() - t\n"
            "print(took * 1e3, (rss() - before) / 1024)")
    runs = [subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
            for _ in range(5)]
    return {"import_ms": statistics.median(float(r[0]) for r in runs),
            "rss_added_mib": statistics.median(float(r[1]) for r in runs)}


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                    platform.machine())


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {f"{key}_{stat}": round(fn([r[key] for r in rows]), 2) for key in ("wall_ms", "cpu_ms")
            for stat, fn in (("p50", statistics.median), ("mean", statistics.fmean))}


def run(rounds: int) -> dict[str, object]:
    fleet = FleetExporter(requests_per_s=1.0).start()
    deployments = [f"tm{i:04d}-runtime" for i in range(NUM_DEPLOYMENTS)]
    targets = [fleet.add(NAMESPACE, name, "fleet") for name in deployments]
    with tempfile.TemporaryDirectory() as workdir:
        prom = Prometheus(Path(workdir), scrape_interval_s=5.0)
        try:
            prom.set_targets(targets)
            prom.wait_for_scrapes(timeout_s=600)
            time.sleep(WINDOW_S)  # a full window of samples behind every read
            share = frozenset(deployments[: NUM_DEPLOYMENTS // INSTANTS_PER_WINDOW])
            clients = {"prometheus-api-client": PrometheusClient, "httpx": HttpxClient}
            rows: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
            for _ in range(rounds):  # alternating: both see the same Prometheus and the same machine load
                for name, make in clients.items():
                    rows[name].append(one_read(make, prom.url, share))
        finally:
            prom.stop()
            fleet.stop()
    groups = {name: rows[name][-1]["groups"] for name in rows}
    return {"deployments": NUM_DEPLOYMENTS, "deployments_per_read": len(share), "rounds": rounds, "groups": groups,
            "reads": {name: summary(found) for name, found in rows.items()},
            "imports": {"prometheus-api-client": import_cost("prometheus_api_client.prometheus_connect"),
                        "httpx": import_cost("httpx")},
            "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(),
                        "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]}}


def markdown(result: dict) -> str:
    reads, imports = result["reads"], result["imports"]
    lines = [
        "# Prometheus client: prometheus-api-client against httpx, one grouped window read",
        "",
        f"Real Prometheus scraping {result['deployments']} fleet deployments; each read asks for "
        f"{result['deployments_per_read']} of them (one instant's share at 1,000 TunedModels), {result['rounds']} "
        "rounds alternating the clients in one process. CPU is the calling thread's (the client's own work; "
        f"Prometheus' is in the wall time of both). Machine: {result['machine']}.",
        "",
        "| client | wall ms p50 / mean | client CPU ms p50 / mean | import ms | RSS added MiB |",
        "|---|---|---|---|---|",
    ]
    for name in reads:
        r, i = reads[name], imports[name]
        lines.append(f"| {name} | {r['wall_ms_p50']} / {r['wall_ms_mean']} | {r['cpu_ms_p50']} / {r['cpu_ms_mean']} "
                     f"| {i['import_ms']:.0f} | {i['rss_added_mib']:.1f} |")
    ratio = reads["prometheus-api-client"]["cpu_ms_mean"] / max(reads["httpx"]["cpu_ms_mean"], 1e-9)
    reads_per_s = INSTANTS_PER_WINDOW / WINDOW_S
    extra_ms_per_s = (reads["prometheus-api-client"]["cpu_ms_mean"] - reads["httpx"]["cpu_ms_mean"]) * reads_per_s
    lines += ["", f"prometheus-api-client's CPU per read is {ratio:.2f}x httpx's; at {INSTANTS_PER_WINDOW} reads per "
              f"{WINDOW_S:.0f} s window that is {extra_ms_per_s:+.1f} ms of CPU per second for the whole fleet."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    result = run(args.rounds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "promql_client.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "promql_client.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
