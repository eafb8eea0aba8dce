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

    python -m bench.bench_operator_scale                    # N = 10, 100, 500, 1,000 (about 45 min)
    python -m bench.bench_operator_scale --counts 500 1000  # the large ones
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
TARGETS = {"create_to_deployment_p99_s": 5.0, "tick_lag_p99_share_of_window": 0.10, "delete_p99_s": 2.0,
           "operator_rss_mib": 1024.0}  # issue 15's bar at 1,000 TunedModels
COUNTS = (10, 100, 500, 1000)
WINDOW_S = 60.0
STEADY_WINDOWS = 2
DELETE_SAMPLE = 50
NEWCOMERS = 20  # TunedModels created one at a time into the steady fleet
# At the largest N: creates paced at a rate the control plane sustains (the 1,000 burst made 1.7 Deployments/s), the
# latency a user sees while a fleet grows steadily, next to the burst's, which measures how fast a queue drains.
PACED, PACED_PER_S = 100, 1.0
SCRAPE_INTERVAL_S = 15.0  # a thousand targets on two cores: a shorter interval starves the exporter
GROUP, VERSION, PLURAL = "slotune.io", "v1alpha1", "tunedmodels"
WORKERS = 16  # slotune.settings.OperatorSettings.workers: the operator's default, which the bench runs with
PHASES_DUE = 15  # slotune.controller.windows.PHASES: instants a window's ends are spread over in a large namespace


class Watcher:
    """First time each Deployment was seen, each TunedModel seen with a measured window, and each seen deleted
    (from watches: polling a list of a thousand TunedModels would itself load the API server under test)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.deployments: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.measured: set[str] = set()
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
        elif ((event["object"].get("status") or {}).get("iteration") or 0) >= 1:
            self.measured.add(meta["name"])
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


def scrape_health(prometheus: Prometheus, n: int, window_s: float) -> dict[str, Any]:
    """Whether Prometheus scraped every fleet target, and how long its scrapes took: the harness must not be what
    fails (at 1,000 a thread-per-request exporter dropped scrapes and the operator read missing windows)."""
    def value(promql: str) -> float | None:
        found = prometheus.query(promql)
        return float(found[0]["value"][1]) if found else None

    up = value("count(up == 1)") or 0.0
    over_steady = f"[{int(STEADY_WINDOWS * window_s)}s]"
    return {"targets": n, "up": int(up),
            "lowest_up_share_steady": value(f"min(avg_over_time(up{over_steady}))"),
            "scrape_duration_p99_s": value("quantile(0.99, scrape_duration_seconds)"),
            "scrape_duration_max_s": value(f"max(max_over_time(scrape_duration_seconds{over_steady}))")}


def apiserver_counters(cluster: kwok_cluster.Cluster) -> tuple[float, float, float]:
    """Requests served (all clients), and etcd writes' total seconds and count (the control plane's own speed)."""
    requests = etcd_write_s = etcd_writes = 0.0
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        value = line.rpartition(" ")[2]
        if line.startswith("apiserver_request_total{"):
            requests += float(value)
        elif line.startswith("etcd_request_duration_seconds_") and any(
                f'operation="{op}"' in line for op in ("create", "update", "delete")):
            if line.startswith("etcd_request_duration_seconds_sum{"):
                etcd_write_s += float(value)
            elif line.startswith("etcd_request_duration_seconds_count{"):
                etcd_writes += float(value)
    return requests, etcd_write_s, etcd_writes


CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def cpu_seconds(cluster: kwok_cluster.Cluster, operator_pid: int) -> dict[str, float]:
    """CPU seconds used so far by each control-plane process of this cluster, the operator, and the whole machine
    (busy, from /proc/stat): whether a burst was bound by the machine's cores, and by whom."""
    used = dict.fromkeys((*CONTROL_PLANE, "operator"), 0.0)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            binary = Path(argv[0].decode()).name
            if binary in CONTROL_PLANE and f"/{cluster.name}/".encode() in b" ".join(argv):
                used[binary] += operator_cpu_s(int(proc.name))
        except (OSError, IndexError, UnicodeDecodeError):
            continue
    used["operator"] = operator_cpu_s(operator_pid)
    fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    # user, nice, system, irq, softirq (guest time is already inside user and nice; idle, iowait, steal are not busy)
    used["machine_busy"] = sum(fields[i] for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")
    return used


def apiserver_requests_by_kind(cluster: kwok_cluster.Cluster) -> dict[str, float]:
    """Requests served per "verb resource" (all clients, watches and long-running requests left out)."""
    found: dict[str, float] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(part.split("=", 1) for part in line[len("apiserver_request_total{"):].rpartition("}")[0]
                          .split(",") if "=" in part)
            verb, resource = labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"')
            if verb in ("WATCH", "CONNECT"):
                continue
            key = f"{verb} {resource}"
            found[key] = found.get(key, 0.0) + float(line.rpartition(" ")[2])
    return found


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


def run_count(cluster: kwok_cluster.Cluster, n: int, window_s: float, workdir: Path, paced: int = 0,
              steady_windows: int = STEADY_WINDOWS, py_spy: str | None = None,
              compare_workers: tuple[int, ...] = ()) -> dict[str, Any]:
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
        "SLOTUNE_WATCH_NAMESPACES": namespace,
        # INFO: the harness waits for kopf's INFO line that the startup handler ran (tests/e2e/harness/operator.py).
        "SLOTUNE_LOG_LEVEL": "INFO",
        # The operator's default: the tests' 90 s failed every rollout of a 500-create burst while the controllers
        # worked through it (the TunedModels ended Degraded, as they should at that timeout).
        "SLOTUNE_ROLLOUT_TIMEOUT_S": "600"})
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

        burst_cpu = cpu_seconds(cluster, pid)
        burst_before = scrape(operator_url), apiserver_requests_by_kind(cluster), time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, names))
        wait_for_progress(lambda: len(watcher.deployments), n, 300, "Deployments", interval_s=2.0)
        burst_after = scrape(operator_url), apiserver_requests_by_kind(cluster), time.monotonic()
        burst_cpu = {k: v - burst_cpu[k] for k, v in cpu_seconds(cluster, pid).items()}

        wait_for_progress(lambda: len(watcher.measured), n, max(10 * window_s, 600), "a measured window each",
                          interval_s=2.0)
        before = scrape(operator_url), scrape(f"{prometheus.url}/metrics"), apiserver_counters(cluster)
        cpu_before, steady_started, load_before = operator_cpu_s(pid), time.monotonic(), os.getloadavg()[0]
        profiles = profile(py_spy, pid, steady_windows * window_s, workdir / f"py-spy-{n}") if py_spy else []
        time.sleep(steady_windows * window_s)
        steady_s = time.monotonic() - steady_started
        after = scrape(operator_url), scrape(f"{prometheus.url}/metrics"), apiserver_counters(cluster)
        cpu_s, rss_mib, load_after = operator_cpu_s(pid) - cpu_before, operator_rss_mib(pid), os.getloadavg()[0]
        for recorder in profiles:  # after the steady span is measured: py-spy takes a while to write its stacks
            recorder.wait(timeout=120)
        targets = scrape_health(prometheus, n, window_s)

        # One more TunedModel at a time into the running fleet: how long a user waits for a new one's Deployment
        # with N others ticking (the burst above measures how fast the control plane absorbs N creates at once).
        newcomers = [f"new{i:03d}" for i in range(NEWCOMERS)]
        for name in newcomers:
            create(name)
            wait_for_progress(lambda name=name: int(name in watcher.deployments), 1, 120, f"{name}'s Deployment",
                              interval_s=0.05)

        paced_names = [f"paced{i:03d}" for i in range(paced)]
        paced_started = time.monotonic()
        for i, name in enumerate(paced_names):
            time.sleep(max(0.0, paced_started + i / PACED_PER_S - time.monotonic()))
            create(name)
        if paced_names:
            wait_for_progress(lambda: sum(1 for p in paced_names if p in watcher.deployments), len(paced_names), 120,
                              "paced Deployments", interval_s=0.5)

        compared = {}
        for workers in compare_workers:  # each on a restarted operator, one after the other on the same fleet
            operator.stop()
            operator.env["SLOTUNE_WORKERS"] = str(workers)
            operator.start()
            assert operator.process is not None
            pid = operator.process.pid
            compared[str(workers)] = compare_phase(operator_url, create, watcher, len(created), window_s, workers,
                                                   f"w{workers}-")

        sample = names[:: max(1, n // DELETE_SAMPLE)][:DELETE_SAMPLE]
        before_deletes = scrape(operator_url)
        deleted_at = {}
        for name in sample:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            deleted_at[name] = time.time()
        wait_for_progress(lambda: sum(1 for s in sample if s in watcher.deleted), len(sample), 60, "deletions",
                          interval_s=0.2)
        after_deletes = scrape(operator_url)
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
    newcomer_s = [watcher.deployments[name] - created[name] for name in newcomers]
    paced_s = [watcher.deployments[name] - created[name] for name in paced_names]
    burst_s = max(watcher.deployments[name] for name in names) - min(created.values())
    delete_s = [watcher.deleted[name] - deleted_at[name] for name in sample]
    promql = delta(1, 'prometheus_http_requests_total{code="200",handler="/api/v1/query"}')
    slotune_api = sum(after[0][k] - before[0].get(k, 0.0) for k in after[0]
                      if k.startswith("slotune_operator_api_requests_total"))
    burst = burst_requests(burst_before, burst_after, n)
    burst["cpu_cores_used"] = {k: round(v / burst["seconds"], 2) for k, v in burst_cpu.items()}
    return {
        "tunedmodels": n, "window_s": window_s, "steady_s": round(steady_s, 1), "steady_windows": steady_windows,
        "burst": burst, "workers_compared": compared or None,
        "load_average_1m": {"steady_start": round(load_before, 2), "steady_end": round(load_after, 2)},
        "prometheus_targets": targets,
        "create_to_deployment_s": {"p50": percentile(create_s, 50), "p99": percentile(create_s, 99)},
        "burst_deployments_per_s": round(n / burst_s, 1),
        "newcomer_create_to_deployment_s": {"p50": percentile(newcomer_s, 50), "p99": percentile(newcomer_s, 99),
                                            "max": max(newcomer_s), "sample": len(newcomer_s)},
        "tick_lag_s": {"p50_at_most": bucket_quantile(before[0], after[0], "slotune_operator_tick_lag_seconds", 50),
                       "p99_at_most": bucket_quantile(before[0], after[0], "slotune_operator_tick_lag_seconds", 99),
                       "ticks": delta(0, "slotune_operator_tick_lag_seconds_count")},
        # Why ticks lag: the workers' busy share (tick time / (workers x time)); near 1, ticks queue for a worker.
        "tick_duration_s": {
            "mean": round(delta(0, "slotune_operator_tick_duration_seconds_sum")
                          / max(1.0, delta(0, "slotune_operator_tick_duration_seconds_count")), 3),
            "p99_at_most": bucket_quantile(before[0], after[0], "slotune_operator_tick_duration_seconds", 99),
            "workers_busy_share": round(delta(0, "slotune_operator_tick_duration_seconds_sum") / steady_s
                                        / WORKERS, 2)},
        "window_read_delay_s": {
            "p50_at_most": bucket_quantile(before[0], after[0], "slotune_operator_window_read_delay_seconds", 50),
            "p99_at_most": bucket_quantile(before[0], after[0], "slotune_operator_window_read_delay_seconds", 99),
            "reads": delta(0, "slotune_operator_window_read_delay_seconds_count")},
        # Why a read answers late: its wait for one of the two reader threads, and its queries once sent.
        "window_read_queued_s": {
            q: bucket_quantile(before[0], after[0], "slotune_operator_window_read_queued_seconds", p)
            for q, p in (("p50_at_most", 50), ("p99_at_most", 99))},
        "window_read_duration_s": {
            q: bucket_quantile(before[0], after[0], "slotune_operator_window_read_duration_seconds", p)
            for q, p in (("p50_at_most", 50), ("p99_at_most", 99))},
        "event_loop_lag_s": {
            "steady_p99_at_most": bucket_quantile(before[0], after[0], "slotune_operator_event_loop_lag_seconds", 99),
            "deletes_p99_at_most": bucket_quantile(before_deletes, after_deletes,
                                                   "slotune_operator_event_loop_lag_seconds", 99)},
        "diagnostics": diagnostics(before[0], after[0], n, steady_s / window_s),
        "paced_create_to_deployment_s": ({"p50": percentile(paced_s, 50), "p99": percentile(paced_s, 99),
                                          "max": max(paced_s), "sample": len(paced_s), "per_s": PACED_PER_S}
                                         if paced_s else None),
        "delete_to_gone_s": {"p50": percentile(delete_s, 50), "p99": percentile(delete_s, 99),
                             "sample": len(delete_s)},
        "sigterm_to_exit_s": round(sigterm_s, 2),
        "operator_rss_mib": round(rss_mib, 1),
        "operator_cpu_ms_per_tunedmodel_per_window": round(1000 * cpu_s / n / (steady_s / window_s), 2),
        "operator_cpu_share_of_one_core": round(cpu_s / steady_s, 3),
        "apiserver_requests_per_s_all_clients": round((after[2][0] - before[2][0]) / steady_s, 1),
        "etcd_write_mean_ms": round(1000 * (after[2][1] - before[2][1]) / max(1.0, after[2][2] - before[2][2]), 1),
        "slotune_api_requests_per_s": round(slotune_api / steady_s, 2),
        "promql_queries_per_s": round(promql / steady_s, 2),
        "slotune_promql_queries_per_s": round(delta(0, "slotune_operator_promql_queries_total") / steady_s, 2),
    }


def diagnostics(before: dict[str, float], after: dict[str, float], n: int, windows: float) -> dict[str, Any]:
    """Where the operator's time went in the steady windows (its own metrics): ticks per TunedModel per window by what
    the next one waits for, ticks that met a read in flight, full-GC pauses, and API request time by method."""
    def delta(sample: str) -> float:
        return after.get(sample, 0.0) - before.get(sample, 0.0)

    per_tm_window = max(1.0, n * windows)
    api = {}
    for method in ("GET", "PATCH", "POST", "PUT", "DELETE"):
        count = delta(f'slotune_operator_api_request_seconds_count{{method="{method}"}}')
        if count:
            api[method] = {"count": count, "mean_s": round(delta(
                f'slotune_operator_api_request_seconds_sum{{method="{method}"}}') / count, 3)}
    return {"ticks_per_tm_window": {kind: round(delta(f'slotune_operator_ticks_total{{next="{kind}"}}') / per_tm_window,
                                                2) for kind in ("window", "poll")},
            "ticks_looked_per_tm_window": round(delta("slotune_operator_ticks_looked_total") / per_tm_window, 2),
            "ticks_read_in_flight_per_tm_window": round(
                delta("slotune_operator_ticks_read_in_flight_total") / per_tm_window, 2),
            "full_gc": {"count": delta("slotune_operator_gc_pause_seconds_count"),
                        "seconds": round(delta("slotune_operator_gc_pause_seconds_sum"), 2),
                        "p99_at_most": bucket_quantile(before, after, "slotune_operator_gc_pause_seconds", 99)},
            "api_request_s": api}


def profile(py_spy: str, pid: int, seconds: float, prefix: Path) -> list[subprocess.Popen]:
    """py-spy over the steady windows, two ways: every thread, waiting or not (where a tick's time goes), and only
    threads running Python (what uses the CPU and the GIL). Collapsed stacks, one file each."""
    common = [py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "20", "--format",
              "raw", "--nonblocking", "--threads"]
    return [subprocess.Popen([*common, *extra, "-o", f"{prefix}-{kind}.txt"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for kind, extra in (("all", ["--idle"]), ("gil", ["--gil"]))]


def compare_phase(operator_url: str, create: Any, watcher: Watcher, fleet: int, window_s: float, workers: int,
                  prefix: str) -> dict[str, Any]:
    """An operator just restarted with `workers` tick workers, on the running fleet: once every daemon ticked, one
    window of tick lag and event-loop lag, then NEWCOMERS // 2 creates one at a time (create->Deployment)."""
    wait_for_progress(lambda: int(scrape(operator_url).get("slotune_operator_tick_lag_seconds_count", 0.0)), fleet,
                      900, "a tick of every daemon after the restart", interval_s=5.0)
    before, started = scrape(operator_url), time.monotonic()
    time.sleep(window_s)
    after, seconds = scrape(operator_url), time.monotonic() - started
    newcomer_s = []
    for i in range(NEWCOMERS // 2):
        name = f"{prefix}{i:03d}"
        created = time.time()
        create(name)
        wait_for_progress(lambda name=name: int(name in watcher.deployments), 1, 120, f"{name}'s Deployment",
                          interval_s=0.05)
        newcomer_s.append(watcher.deployments[name] - created)

    def quantile(metric: str, q: float) -> float | None:
        return bucket_quantile(before, after, metric, q)

    busy = after.get("slotune_operator_tick_duration_seconds_sum", 0.0) - before.get(
        "slotune_operator_tick_duration_seconds_sum", 0.0)
    return {"workers": workers, "seconds": round(seconds, 1), "diagnostics": diagnostics(before, after, fleet, 1.0),
            "tick_lag_s": {"p50_at_most": quantile("slotune_operator_tick_lag_seconds", 50),
                           "p99_at_most": quantile("slotune_operator_tick_lag_seconds", 99)},
            "event_loop_lag_p99_at_most_s": quantile("slotune_operator_event_loop_lag_seconds", 99),
            "workers_busy_share": round(busy / seconds / workers, 2),
            "newcomer_create_to_deployment_s": {"p50": percentile(newcomer_s, 50), "p99": percentile(newcomer_s, 99),
                                                "max": max(newcomer_s), "sample": len(newcomer_s)}}


def burst_requests(before: tuple[dict[str, float], dict[str, float], float],
                   after: tuple[dict[str, float], dict[str, float], float], n: int) -> dict[str, Any]:
    """What the burst of n creates cost the API server (all clients, by verb and resource, and slotune's own), and
    the bound it sets: the last Deployment can come no sooner than n x requests per create / requests per second
    (the API server's throughput, shared by every client, over the burst)."""
    seconds = after[2] - before[2]
    kinds = {k: after[1][k] - before[1].get(k, 0.0) for k in after[1]}
    total = sum(kinds.values())
    slotune = sum(after[0][k] - before[0].get(k, 0.0) for k in after[0]
                  if k.startswith("slotune_operator_api_requests_total"))
    top = sorted(((k, v) for k, v in kinds.items() if v > 0), key=lambda kv: -kv[1])[:12]
    mine: Counter[str] = Counter()
    for sample, value in after[0].items():
        if sample.startswith("slotune_operator_api_requests_total{"):
            labels = dict(part.split("=", 1) for part in sample.split("{", 1)[1].rstrip("}").split(","))
            kind = " ".join(labels.get(k, "").strip('"') for k in ("method", "resource"))
            mine[kind] += value - before[0].get(sample, 0.0)
    return {"seconds": round(seconds, 1), "apiserver_requests_per_s": round(total / seconds, 1),
            "requests_per_create_all_clients": round(total / n, 1),
            "slotune_requests_per_create": round(slotune / n, 2),
            "requests_per_create_by_kind": {k: round(v / n, 2) for k, v in top},
            "slotune_requests_per_create_by_kind": {k: round(v / n, 2) for k, v in mine.most_common() if v > 0}}


def machine() -> dict[str, object]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    return {"cpu_model": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average_1m_end": os.getloadavg()[0]}


def _load(result: dict[str, Any]) -> str:
    load = result["machine"].get("load_average_1m_end")
    return result.get("note") or f"load average {load:.1f} at the end"


def verdict(run: dict[str, Any]) -> str:
    """Issue 15's bar, met or missed, for one run."""
    checks = [("create->Deployment p99 (burst)", run["create_to_deployment_s"]["p99"],
               TARGETS["create_to_deployment_p99_s"], "s"),
              ("create->Deployment p99 (one more into the fleet)", run["newcomer_create_to_deployment_s"]["p99"],
               TARGETS["create_to_deployment_p99_s"], "s"),
              ("tick lag p99", run["tick_lag_s"]["p99_at_most"],
               TARGETS["tick_lag_p99_share_of_window"] * run["window_s"], "s"),
              ("delete p99", run["delete_to_gone_s"]["p99"], TARGETS["delete_p99_s"], "s"),
              ("RSS", run["operator_rss_mib"], TARGETS["operator_rss_mib"], " MiB")]
    return "; ".join(f"{what} {value:.3g}{unit} {'met' if value < bar else 'MISSED'} (< {bar:g}{unit})"
                     for what, value, bar, unit in checks)


def _q(run: dict[str, Any], key: str) -> str:
    return str((run.get(key) or {}).get("p99_at_most", "?"))  # runs recorded before the measure: "?"


def _workers(run: dict[str, Any]) -> str:
    ticks = run.get("tick_duration_s")
    if not ticks:
        return " on 8 workers"  # runs recorded before the measure
    said = (f", each {ticks['mean']:.2f} s on a worker on average (p99 <= {ticks['p99_at_most']} s): the "
            f"{WORKERS} workers were {ticks['workers_busy_share']:.0%} busy")
    found = run.get("diagnostics")
    if found:
        per = found["ticks_per_tm_window"]
        api = "; ".join(f"{method} {v['count'] / run.get('steady_s', 1.0):.1f}/s answered in {v['mean_s']:.2f} s "
                        "on average" for method, v in found["api_request_s"].items())
        said += (f" ({per['window']:.2f} ticks per TunedModel per window took a window's readings and "
                 f"{per['poll']:.2f} polled, {found['ticks_read_in_flight_per_tm_window']:.2f} met a read in flight; "
                 f"slotune's API requests: {api})")
    profile = run.get("profile")
    if profile:
        waits = ", ".join(f"{share:.0%} {what}" for what, share in profile["tick_threads"].items())
        gil = ", ".join(f"{thread} {share:.0%}" for thread, share in profile["gil_by_thread"].items())
        said += (f". py-spy over the steady windows: the tick workers' time went to {waits}; the GIL was held "
                 f"{profile['gil_held_share']:.0%} of the time, by {gil}")
    gc_seen = (found or {}).get("full_gc")
    if gc_seen and gc_seen["count"]:
        said += (f"; {gc_seen['count']:.0f} full garbage collections took {gc_seen['seconds']:.1f} s "
                 f"(p99 <= {gc_seen['p99_at_most']} s each), stopping every thread")
    return said


def profile_summary(all_threads: Path, gil: Path, seconds: float, rate_hz: float = 20.0) -> dict[str, Any]:
    """py-spy's collapsed stacks (`profile`) -> where the tick workers' time went (by the slotune call they were in
    at the leaf: the status PATCH, an event POST, a read of the window, other) and who held the GIL."""
    def stacks(path: Path) -> list[tuple[str, list[str], int]]:
        found = []
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            thread = frames[0].split("): ", 1)[-1].rstrip("_0123456789") if "): " in frames[0] else frames[0]
            found.append((thread, frames[1:], int(count)))
        return found

    kinds = (("EventRecorder", "event POSTs"), ("StatusStateStore", "the status PATCH"),
             ("KubeAPI.request", "other API requests"), ("SharedWindows", "window reads"))
    ticks: Counter[str] = Counter()
    for thread, frames, count in stacks(all_threads):
        if thread != "slotune-tick":
            continue
        text = ";".join(frames)
        if "KubeAPI.request" not in text and "slotune/" not in text:
            ticks["idle"] += count
            continue
        ticks[next((what for key, what in kinds if key in text), "Python work")] += count
    total = sum(ticks.values()) or 1
    held: Counter[str] = Counter()
    for thread, _, count in stacks(gil):
        held[thread] += count
    held_total = sum(held.values()) or 1
    return {"tick_threads": {k: round(v / total, 2) for k, v in ticks.most_common()},
            "gil_held_share": round(min(1.0, held_total / (seconds * rate_hz)), 2),
            "gil_by_thread": {k: round(v / held_total, 2) for k, v in held.most_common(4)}}


def _paced(run: dict[str, Any]) -> str:
    paced = run.get("paced_create_to_deployment_s")
    if not paced:
        return ""
    return (f"{paced['sample']} creates paced at {paced['per_s']:g}/s into the running fleet got their Deployments "
            f"p50 {paced['p50']:.2f} s / p99 {paced['p99']:.2f} s after the create (the latency while a fleet grows "
            f"at a rate the control plane sustains). ")


def limit(result: dict[str, Any]) -> str:
    """What the largest run met, what it missed, and what bounds it (numbers from the result, never typed)."""
    run = max(result["runs"], key=lambda r: r["tunedmodels"])
    n, load, api = run["tunedmodels"], run["load_average_1m"], run["apiserver_requests_per_s_all_clients"]
    burst, windows = run["burst"], run["steady_s"] / run["window_s"]  # the steady span as measured, in windows
    cores = burst["cpu_cores_used"]
    saturated = ("The rate was the machine's: " if cores["machine_busy"] >= 0.9 * result["machine"]["cores"]
                 else "The machine was not saturated: ")
    kinds = ", ".join(f"{kind} {count:g}" for kind, count in list(burst["requests_per_create_by_kind"].items())[:8])
    per_tm_window = run["slotune_api_requests_per_s"] * run["window_s"] / n
    own = burst.get("slotune_requests_per_create_by_kind") or {}  # runs before the counter had a resource label
    mine = f" ({', '.join(f'{kind} {count:g}' for kind, count in own.items())})" if own else ""
    return (
        f"At {n} TunedModels: {verdict(run)}. "
        f"Steady state: a tick reads its Deployment and Secret from the operator's watches and writes its status only "
        f"when it changed, so slotune sent {per_tm_window:.2f} API requests per TunedModel per window "
        f"({run['slotune_api_requests_per_s']:.1f}/s of the API server's {api:.0f}/s from all clients); window ends "
        f"are spread over the window by a hash of each TunedModel's name, each instant's grouped PromQL read asks for "
        f"its own deployments only (answered <= {run['window_read_delay_s']['p99_at_most']} s after the window's "
        f"end, p99). The operator used {run['operator_cpu_share_of_one_core']:.0%} of one core and "
        f"{run['operator_rss_mib']:.0f} MiB (load average {load['steady_start']:.1f} / {load['steady_end']:.1f} over "
        f"the steady windows). Tick lag: in the steady windows the operator made "
        f"{run['window_read_delay_s']['reads'] / windows:.0f} grouped reads a window where the spread grid has "
        f"at most {PHASES_DUE} instants a window, p50 answered <= {run['window_read_delay_s']['p50_at_most']} s after "
        f"its window's end (inf: over 120 s), queued <= {_q(run, 'window_read_queued_s')} s for a reader thread "
        f"and took <= {_q(run, 'window_read_duration_s')} s (p99; a TunedModel registers for its window before it "
        f"ends, a late one for its next instant, so an instant's one read covers it), and "
        f"{run['tick_lag_s']['ticks'] / n / windows:.1f} ticks per TunedModel per window{_workers(run)}. "
        f"The burst of {n} creates is bound by the API server, shared by every client: it "
        f"served {burst['apiserver_requests_per_s']:.0f} requests/s over the {burst['seconds']:.0f} s the burst "
        f"took, and each create cost {burst['requests_per_create_all_clients']:.1f} requests from all clients "
        f"({burst['slotune_requests_per_create']:.1f} of them slotune's own{mine}; by verb and resource, all clients: "
        f"{kinds}), so the "
        f"last of {n} Deployments came at {n} x {burst['requests_per_create_all_clients']:.1f} / "
        f"{burst['apiserver_requests_per_s']:.0f} = "
        f"{n * burst['requests_per_create_all_clients'] / burst['apiserver_requests_per_s']:.0f} s after the first "
        f"create at that rate. {saturated}over the burst its {result['machine']['cores']} cores "
        f"were {cores['machine_busy']:.2f} cores busy (every process), of which the API server "
        f"{cores['kube-apiserver']:.2f}, etcd {cores['etcd']:.2f}, the controller-manager "
        f"{cores['kube-controller-manager']:.2f}, kwok {cores['kwok-controller']:.2f}, the scheduler "
        f"{cores['kube-scheduler']:.2f} and the operator {cores['operator']:.2f}. Below 5 s p99 for {n} creates "
        f"needs a control plane that serves {n * burst['requests_per_create_all_clients'] / 5:.0f} requests in 5 s; "
        "on this machine the operator can only cut its own share. A TunedModel created alone into the running fleet "
        f"waits only for its own (the 'one more' column). {_paced(run)}"
        "Harness: Prometheus scraped every fleet target (the 'targets up' column), etcd ran without fsync and the "
        "controller-manager at 500 requests/s (the shared disk's fsync and its default 20/s measured the test "
        "cluster, not the operator), and the burst starts with the operator process, so at 10 its create->Deployment "
        "is the operator's start-up.")


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "# Operator scale (one replica, kwok control plane, real Prometheus)", "",
        f"Machine: {result['machine']['cpu_model']}, {result['machine']['cores']} cores, {_load(result)}. "
        f"Windows of {result['window_s']:.0f} s, "
        f"{result['runs'][0].get('steady_windows', STEADY_WINDOWS) if result['runs'] else STEADY_WINDOWS} windows "
        "of steady state per N; tick lag is an upper bound (histogram bucket edge), counted from the moment a tick's "
        "window readings are in (a daemon awaits its window's shared read on the event loop; that read's own delay "
        "after the window's end is the 'window read delay' column), so a window's end to its tick takes at most the "
        "two added."
        + (f" Asked for N = {', '.join(map(str, result['counts']))}; not finished before the run was stopped: "
           f"{', '.join(map(str, result['unfinished']))}." if result.get("unfinished") else ""), "",
        limit(result), "",
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
    rows += [
        "", "What else each run saw: a TunedModel created alone into the running fleet (create->Deployment), how fast "
        "the burst of N creates became Deployments, how long after a window's end its grouped read answered, whether "
        "Prometheus scraped every fleet target, the control plane's etcd write time, and the machine's load.", "",
        "| TunedModels | one more, create->Deployment p50 / p99 s | burst Deployments/s "
        "| window read delay p50 / p99 s | targets up (lowest share in steady state) | scrape p99 s "
        "| etcd write mean ms | load average (steady start / end) | read queued / took p99 s "
        "| event loop lag p99 s (steady / deletes) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["runs"]:
        new, read = row["newcomer_create_to_deployment_s"], row["window_read_delay_s"]
        targets, load = row["prometheus_targets"], row["load_average_1m"]
        rows.append(
            f"| {row['tunedmodels']} | {new['p50']:.2f} / {new['p99']:.2f} | {row['burst_deployments_per_s']:.1f} "
            f"| <= {read['p50_at_most']} / <= {read['p99_at_most']} | {targets['up']}/{targets['targets']} "
            f"({targets['lowest_up_share_steady']:.2f}) | {targets['scrape_duration_p99_s']:.3f} "
            f"| {row['etcd_write_mean_ms']:.0f} | {load['steady_start']:.1f} / {load['steady_end']:.1f} "
            f"| <= {_q(row, 'window_read_queued_s')} / <= {_q(row, 'window_read_duration_s')} "
            f"| <= {(row.get('event_loop_lag_s') or {}).get('steady_p99_at_most', '?')} / "
            f"<= {(row.get('event_loop_lag_s') or {}).get('deletes_p99_at_most', '?')} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_operator_scale")
    parser.add_argument("--counts", type=int, nargs="+", default=list(COUNTS))
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where operator_scale.json and .md go")
    parser.add_argument("--render", action="store_true", help="only render the .md (and json) from the .json there")
    parser.add_argument("--steady-windows", type=int, default=STEADY_WINDOWS)
    parser.add_argument("--paced", type=int, default=PACED, help="creates paced at 1/s at the largest N")
    parser.add_argument("--py-spy", help="a py-spy binary: profile the operator over the steady windows at the "
                        "largest N (collapsed stacks next to the results)")
    parser.add_argument("--compare-workers", type=int, nargs="*", default=[],
                        help="at the largest N, restart the operator with each of these tick worker counts in turn")
    args = parser.parse_args(argv)
    if args.render:
        recorded = json.loads((args.out / "operator_scale.json").read_text())
        args.counts, args.window_s = recorded["counts"], recorded["window_s"]
        for run in recorded["runs"]:
            files = [args.out / f"py-spy-{run['tunedmodels']}-{kind}.txt" for kind in ("all", "gil")]
            if all(f.exists() for f in files):
                run["profile"] = profile_summary(*files, run["steady_s"])
        print(markdown(write(args, recorded["runs"], recorded["machine"])))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still tear the cluster and processes down
    with tempfile.TemporaryDirectory(prefix="slotune-scale-") as tmp:
        workdir = Path(tmp)
        # kwokctl's default service range holds about 250 ClusterIPs: a Service each for 1,000 TunedModels needs more.
        # kwok nodes take the kubelet's 110 pods each: two hold 220 runtime pods, so a third node, a wide one.
        nodes = (*kwok_cluster.DEFAULT_NODES, kwok_cluster.GPUNode("cpu-wide-0", "none", gpus=0, pods=2000))
        # etcd without fsync: on this machine's disk, shared with other work, an fsync'd etcd write took 0.7 s on
        # average at 1,000 TunedModels (every create, status write and event waits for one), which measured the disk,
        # not the operator; a cluster's etcd has a disk of its own. The etcd write time is recorded with each run.
        # The controller-manager's client sends 20 requests/s by default (burst 30), about 3 Deployments rolled out a
        # second; a large cluster raises it, and so does this one.
        wide_services = ("kube-apiserver=service-cluster-ip-range=10.96.0.0/16", "etcd=unsafe-no-fsync=true",
                         "kube-controller-manager=kube-api-qps=500", "kube-controller-manager=kube-api-burst=1000")
        cluster = kwok_cluster.Cluster(f"slotune-scale-{os.getpid()}", workdir / "kwok", kwok_cluster.binaries(),
                                       nodes=nodes, extra_args=wide_services)
        cluster.up()
        try:
            install_tunedmodel_crd(cluster)
            runs = []
            for n in args.counts:
                largest = n == max(args.counts)
                runs.append(run_count(cluster, n, args.window_s, workdir, paced=args.paced if largest else 0,
                                      steady_windows=args.steady_windows, py_spy=args.py_spy if largest else None,
                                      compare_workers=tuple(args.compare_workers) if largest else ()))
                for found in workdir.glob("py-spy-*.txt"):
                    args.out.mkdir(parents=True, exist_ok=True)
                    found.replace(args.out / found.name)
                print(json.dumps(runs[-1]), flush=True)
                write(args, runs)  # after each N: a run stopped later keeps the counts it finished
        finally:
            cluster.down()
    print(markdown(write(args, runs)))
    return 0


def write(args: argparse.Namespace, runs: list[dict[str, Any]],
          machine_seen: dict[str, object] | None = None) -> dict[str, Any]:
    """The results of the counts asked for (`counts`, in order) as far as they ran (`runs`; `unfinished`: the
    counts the invocation asked for and did not finish)."""
    done = {run["tunedmodels"] for run in runs}
    result = {"benchmark": "operator_scale", "window_s": args.window_s, "counts": sorted(args.counts),
              "unfinished": [n for n in sorted(args.counts) if n not in done],
              "machine": machine_seen or machine(), "runs": sorted(runs, key=lambda run: run["tunedmodels"])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "operator_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "operator_scale.md").write_text(markdown(result))
    return result


if __name__ == "__main__":
    sys.exit(main())
