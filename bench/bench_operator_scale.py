"""One operator replica against N TunedModels: how fast it deploys, how late its ticks run, what it costs.

Real parts: the kwok control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok; hack/kwok_cluster.py),
Prometheus (Debian), and `slotune operator` as a subprocess, tuning online. kwok runs no containers, so
tests/harness/fleet.py serves every deployment's vLLM metrics to Prometheus (one path per deployment, labelled as a
ServiceMonitor would), and the TunedModels run with hotReconfigure off (pods run their Deployment's arguments; there
is no runtime to read back). For each N:

- create-to-Deployment: each TunedModel's create call returned -> a watch saw its Deployment (p50/p99);
- tick lag: how long after its scheduled time each tick started on a worker (operator metric, steady state);
- delete-to-gone: delete call returned -> a watch saw the TunedModel gone (finalizer released), for a sample;
- SIGTERM-to-exit with every daemon alive; operator RSS; operator CPU per TunedModel; API-server requests/s (all
  clients, from the API server's own counter, and slotune's own); PromQL queries/s (Prometheus' own counter).

    python -m bench.bench_operator_scale                    # N = 10, 100
    python -m bench.bench_operator_scale --counts 500 1000  # see LIMIT below
    python -m bench.bench_operator_scale --counts 10 100    # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, watch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "hack"))

import kwok_cluster  # noqa: E402  (hack/ is scripts, not a package)
from tests.e2e.harness.kube import install_tunedmodel_crd, wait_for_progress  # noqa: E402
from tests.e2e.harness.operator import OperatorProcess  # noqa: E402
from tests.harness.fleet import FleetExporter, fleet_tunedmodel  # noqa: E402
from tests.harness.ports import free_port  # noqa: E402
from tests.harness.prometheus import Prometheus  # noqa: E402

RESULTS = ROOT / "bench" / "results"
LIMIT = (
    "500 and 1,000 TunedModels are not in the table: the runs hit the test cluster, not the operator. kwokctl's "
    "default service range holds about 250 ClusterIPs (the 253rd Service failed 'range is full'), and its two nodes "
    "hold 110 pods each (at 500, pods 221 and on stayed unschedulable, 'Too many pods', and those TunedModels ended "
    "Degraded as they should); both are widened now (a /16 service range, a 2,000-pod node) but the wider run did "
    "not fit in the session. At 1,000 the fleet's metrics exporter, one Python process serving every deployment's "
    "series, also dropped scrapes.")
COUNTS = (10, 100)  # 500 and 1,000: see LIMIT
WINDOW_S = 60.0
STEADY_WINDOWS = 2
DELETE_SAMPLE = 50
SCRAPE_INTERVAL_S = 15.0  # a thousand targets on two cores: a shorter interval starves the exporter
GROUP, VERSION, PLURAL = "slotune.io", "v1alpha1", "tunedmodels"


class Watcher:
    """First time each Deployment was seen, and when each TunedModel was seen deleted."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.deployments: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._deployments, args=(api,), daemon=True),
                         threading.Thread(target=self._tunedmodels, args=(api,), daemon=True)]

    def start(self) -> Watcher:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _deployments(self, api: client.ApiClient) -> None:
        apps = client.AppsV1Api(api)
        self._follow(apps.list_namespaced_deployment, (self.namespace,), self._deployment_event)

    def _tunedmodels(self, api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        self._follow(custom.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, PLURAL),
                     self._tunedmodel_event)

    def _follow(self, lister: Any, args: tuple[str, ...], handle: Any) -> None:
        """Watch from where the last stream ended (its resourceVersion), so no event falls between two streams."""
        version = None
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # an expired version or the cluster going away: start over
                for event in watch.Watch().stream(lister, *args, resource_version=version, timeout_seconds=5):
                    version = handle(event)
                continue
            version = None

    def _deployment_event(self, event: dict[str, Any]) -> str:
        self.deployments.setdefault(event["object"].metadata.name.removesuffix("-runtime"), time.time())
        return event["object"].metadata.resource_version

    def _tunedmodel_event(self, event: dict[str, Any]) -> str:
        meta = event["object"]["metadata"]
        if event["type"] == "DELETED":
            self.deleted.setdefault(meta["name"], time.time())
        return meta["resourceVersion"]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def scrape(url: str) -> dict[str, float]:
    """Prometheus text format -> {sample with labels: value} (enough for counters and histogram buckets)."""
    found: dict[str, float] = {}
    for line in httpx.get(url, timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            try:
                found[sample] = float(value)
            except ValueError:
                continue
    return found


def apiserver_requests(cluster: kwok_cluster.Cluster) -> float:
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{"))


def bucket_quantile(before: dict[str, float], after: dict[str, float], name: str, q: float) -> float | None:
    """The upper edge of the bucket holding quantile q of the histogram's increase (an upper bound)."""
    edges = []
    for sample, value in after.items():
        if sample.startswith(f"{name}_bucket{{"):
            le = sample.split('le="')[1].split('"')[0]
            edges.append((float(le), value - before.get(sample, 0.0)))
    edges.sort()
    total = edges[-1][1] if edges else 0.0
    if total <= 0:
        return None
    return next(le for le, count in edges if count >= q / 100 * total)


def operator_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def operator_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_count(cluster: kwok_cluster.Cluster, n: int, window_s: float, workdir: Path) -> dict[str, Any]:
    namespace = f"scale-{n}"
    cluster.kubectl("create", "namespace", namespace)
    api = cluster.api_client()
    custom = client.CustomObjectsApi(api)
    names = [f"tm{i:04d}" for i in range(n)]
    fleet = FleetExporter(requests_per_s=0.5, tick_s=1.0).start()  # 30 requests a window, minSamples 10
    (workdir / f"prometheus-{n}").mkdir(parents=True)
    prometheus = Prometheus(workdir / f"prometheus-{n}", SCRAPE_INTERVAL_S)
    prometheus.set_targets([fleet.add(namespace, f"{name}-runtime", "fleet") for name in names])
    metrics_port = free_port()
    operator = OperatorProcess(cluster.kubeconfig, workdir / f"operator-{n}", {
        "SLOTUNE_PROMETHEUS_URL": prometheus.url, "SLOTUNE_METRICS_PORT": str(metrics_port), "SLOTUNE_TICK_S": "2",
        "SLOTUNE_WATCH_NAMESPACES": namespace, "SLOTUNE_LOG_LEVEL": "WARNING"})
    watcher = Watcher(api, namespace).start()
    operator_url = f"http://127.0.0.1:{metrics_port}/metrics"
    created: dict[str, float] = {}
    try:
        operator.start()
        assert operator.process is not None
        pid = operator.process.pid

        def create(name: str) -> None:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                   fleet_tunedmodel(name, namespace, window_s))
            created[name] = time.time()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, names))
        wait_for_progress(lambda: len(watcher.deployments), n, 300, "Deployments", interval_s=2.0)

        def measured() -> int:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            return sum(1 for tm in items if ((tm.get("status") or {}).get("iteration") or 0) >= 1)

        wait_for_progress(measured, n, max(3 * window_s, 120), "a measured window each", interval_s=2.0)
        before = scrape(operator_url), scrape(f"{prometheus.url}/metrics"), apiserver_requests(cluster)
        cpu_before, steady_started = operator_cpu_s(pid), time.monotonic()
        time.sleep(STEADY_WINDOWS * window_s)
        steady_s = time.monotonic() - steady_started
        after = scrape(operator_url), scrape(f"{prometheus.url}/metrics"), apiserver_requests(cluster)
        cpu_s, rss_mib = operator_cpu_s(pid) - cpu_before, operator_rss_mib(pid)

        sample = names[:: max(1, n // DELETE_SAMPLE)][:DELETE_SAMPLE]
        deleted_at = {}
        for name in sample:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            deleted_at[name] = time.time()
        wait_for_progress(lambda: sum(1 for s in sample if s in watcher.deleted), len(sample), 60, "deletions",
                          interval_s=0.2)
        stop_started = time.monotonic()
        os.killpg(pid, signal.SIGTERM)
        operator.process.wait(timeout=120)
        sigterm_s = time.monotonic() - stop_started
    except Exception:
        print(operator.log_tail(120), file=sys.stderr)  # why the operator did not get there
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        messages = Counter(((tm.get("status") or {}).get("message") or "no status")[:160] for tm in items)
        print("\n".join(f"{count:5d}  {message}" for message, count in messages.most_common(10)), file=sys.stderr)
        raise
    finally:
        watcher.stop()
        operator.stop()
        prometheus.stop()
        fleet.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    def delta(which: int, sample: str) -> float:
        return after[which].get(sample, 0.0) - before[which].get(sample, 0.0)

    create_s = [watcher.deployments[name] - created[name] for name in names]
    delete_s = [watcher.deleted[name] - deleted_at[name] for name in sample]
    promql = delta(1, 'prometheus_http_requests_total{code="200",handler="/api/v1/query"}')
    slotune_api = sum(after[0][k] - before[0].get(k, 0.0) for k in after[0]
                      if k.startswith("slotune_operator_api_requests_total"))
    return {
        "tunedmodels": n, "window_s": window_s, "steady_s": round(steady_s, 1),
        "create_to_deployment_s": {"p50": percentile(create_s, 50), "p99": percentile(create_s, 99)},
        "tick_lag_s": {"p50_at_most": bucket_quantile(before[0], after[0], "slotune_operator_tick_lag_seconds", 50),
                       "p99_at_most": bucket_quantile(before[0], after[0], "slotune_operator_tick_lag_seconds", 99),
                       "ticks": delta(0, "slotune_operator_tick_lag_seconds_count")},
        "delete_to_gone_s": {"p50": percentile(delete_s, 50), "p99": percentile(delete_s, 99),
                             "sample": len(delete_s)},
        "sigterm_to_exit_s": round(sigterm_s, 2),
        "operator_rss_mib": round(rss_mib, 1),
        "operator_cpu_ms_per_tunedmodel_per_window": round(1000 * cpu_s / n / (steady_s / window_s), 2),
        "operator_cpu_share_of_one_core": round(cpu_s / steady_s, 3),
        "apiserver_requests_per_s_all_clients": round((after[2] - before[2]) / steady_s, 1),
        "slotune_api_requests_per_s": round(slotune_api / steady_s, 2),
        "promql_queries_per_s": round(promql / steady_s, 2),
        "slotune_promql_queries_per_s": round(delta(0, "slotune_operator_promql_queries_total") / steady_s, 2),
    }


def machine() -> dict[str, object]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    return {"cpu_model": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average_1m_end": os.getloadavg()[0]}


def _load(result: dict[str, Any]) -> str:
    load = result["machine"].get("load_average_1m_end")
    return result.get("note") or f"load average {load:.1f} at the end"


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "# Operator scale (one replica, kwok control plane, real Prometheus)", "",
        f"Machine: {result['machine']['cpu_model']}, {result['machine']['cores']} cores, {_load(result)}. "
        f"Windows of {result['window_s']:.0f} s, "
        f"{STEADY_WINDOWS} windows of steady state per N; tick lag is an upper bound (histogram bucket edge).", "",
        LIMIT, "",
        "| TunedModels | create->Deployment p50 / p99 s | tick lag p50 / p99 s | delete p50 / p99 s | SIGTERM s "
        "| RSS MiB | CPU ms per TM per window | API server req/s (all / slotune) | PromQL q/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["runs"]:
        rows.append(
            f"| {row['tunedmodels']} | {row['create_to_deployment_s']['p50']:.2f} / "
            f"{row['create_to_deployment_s']['p99']:.2f} | <= {row['tick_lag_s']['p50_at_most']} / "
            f"<= {row['tick_lag_s']['p99_at_most']} | {row['delete_to_gone_s']['p50']:.2f} / "
            f"{row['delete_to_gone_s']['p99']:.2f} | {row['sigterm_to_exit_s']:.1f} | {row['operator_rss_mib']:.0f} "
            f"| {row['operator_cpu_ms_per_tunedmodel_per_window']:.1f} | "
            f"{row['apiserver_requests_per_s_all_clients']:.0f} / {row['slotune_api_requests_per_s']:.1f} | "
            f"{row['promql_queries_per_s']:.1f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_operator_scale")
    parser.add_argument("--counts", type=int, nargs="+", default=list(COUNTS))
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still tear the cluster and processes down
    with tempfile.TemporaryDirectory(prefix="slotune-scale-") as tmp:
        workdir = Path(tmp)
        # kwokctl's default service range holds about 250 ClusterIPs: a Service each for 1,000 TunedModels needs more.
        # kwok nodes take the kubelet's 110 pods each: two hold 220 runtime pods, so a third node, a wide one.
        nodes = (*kwok_cluster.DEFAULT_NODES, kwok_cluster.GPUNode("cpu-wide-0", "none", gpus=0, pods=2000))
        wide_services = ("kube-apiserver=service-cluster-ip-range=10.96.0.0/16",)
        cluster = kwok_cluster.Cluster(f"slotune-scale-{os.getpid()}", workdir / "kwok", kwok_cluster.binaries(),
                                       nodes=nodes, extra_args=wide_services)
        cluster.up()
        try:
            install_tunedmodel_crd(cluster)
            runs = []
            for n in args.counts:
                runs.append(run_count(cluster, n, args.window_s, workdir))
                print(json.dumps(runs[-1]), flush=True)
        finally:
            cluster.down()
    result = {"benchmark": "operator_scale", "window_s": args.window_s, "counts": args.counts,
              "machine": machine(), "runs": runs}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "operator_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "operator_scale.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
