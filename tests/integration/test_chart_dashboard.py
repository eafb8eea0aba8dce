"""The monitoring that ships with the chart, against a real Prometheus: the Grafana dashboard's queries, run on the
two recorded vLLM scrapes, give the numbers the operator's own scrape path reads from the same text; and the
Prometheus scrape job's relabeling keeps exactly the runtime pods the operator labels (labels taken from the operator's
own Deployment builder) and gives them the `namespace` and `deployment` labels the operator's PromQL selects on.

The Debian Prometheus here is built without Kubernetes service discovery, so the scrape job runs with file-based
discovery that hands Prometheus the `__meta_kubernetes_pod_*` labels its pod role would produce; the relabel rules
are the file's own, evaluated by Prometheus."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from slotune.api import parse_tunedmodel
from slotune.knobs import Engine, RuntimeConfig
from slotune.manifests.resources import ChildNames, build_deployment
from slotune.metrics.exposition import Exposition
from slotune.metrics.names import names_for
from slotune.metrics.promql import Selector
from slotune.metrics.scrape import readings_from_scrapes
from slotune.settings import OperatorSettings
from slotune.snapshot import MetricsSnapshot, Source
from tests.harness.ports import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "slotune-dashboard.json").read_text())
SCRAPE_CONFIG = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape-config.yaml").read_text())
VARIABLES = {"$__rate_interval": "5m", "$namespace": "demo", "$model": ".*", "$ttft_slo_ms": "500",
             "$tpot_slo_ms": "50"}


class RecordedMetrics:
    """Serves one recorded /metrics text at a time, like a runtime whose counters move between scrapes."""

    def __init__(self) -> None:
        self.text = (DATA / "vllm_metrics_a.txt").read_text()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()


def wait_until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.2)


def scalar(prom, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def recorded_window(prometheus) -> Iterator:
    """Prometheus after scraping recorded scrape a a few times, then scrape b a few times."""
    metrics = RecordedMetrics()
    try:
        prom = prometheus(targets=[(metrics.address, {"namespace": "demo", "pod": "llama-runtime-0"})],
                          scrape_interval_s=0.5)
        running = 'count_over_time(vllm:num_requests_running{namespace="demo"}[5m])'
        wait_until(lambda: (scalar(prom, running) or 0) >= 3)
        metrics.text = (DATA / "vllm_metrics_b.txt").read_text()
        wait_until(lambda: scalar(prom, 'sum(vllm:num_requests_running{namespace="demo"})') == 20)
        wait_until(lambda: scalar(prom, 'count_over_time((vllm:num_requests_running{namespace="demo"} == 20)[5m:])'
                                  ) is not None)
        yield prom
    finally:
        metrics.stop()


def operator_snapshot() -> MetricsSnapshot:
    before = Exposition.parse((DATA / "vllm_metrics_a.txt").read_text())
    after = Exposition.parse((DATA / "vllm_metrics_b.txt").read_text())
    return readings_from_scrapes([before], [after], 30.0, names_for(Engine.VLLM), {}).to_snapshot(Source.SCRAPE)


def dashboard_values(prom) -> dict[tuple[str, str], float | None]:
    """(panel title, legend) -> the query's value now; every query must be accepted by Prometheus."""
    values = {}
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            result = prom.query(expr)  # raises on a query Prometheus refuses
            if len(result) == 1 and "legendFormat" in target:
                values[(panel["title"].split(" (")[0], target["legendFormat"])] = float(result[0]["value"][1])
    return values


def test_dashboard_reads_the_same_numbers_as_the_operator(recorded_window) -> None:
    values, snap = dashboard_values(recorded_window), operator_snapshot()
    ttft, tpot = "Time to first token", "Time per output token"
    expected = {
        (ttft, "p50"): snap.ttft.p50_ms / 1000, (ttft, "p95"): snap.ttft.p95_ms / 1000,
        (ttft, "p99"): snap.ttft.p99_ms / 1000, (ttft, "SLO target"): 0.5,
        (tpot, "p50"): snap.itl.p50_ms / 1000, (tpot, "p99"): snap.itl.p99_ms / 1000,
        (tpot, "per-request TPOT p99"): snap.tpot.p99_ms / 1000, (tpot, "SLO target"): 0.05,
        ("Queue / prefill / decode P95", "queue"): snap.queue.p95_ms / 1000,
        ("Prefix-cache hit rate", "hit rate"): snap.prefix_cache_hit_rate,
        ("Speculative decoding acceptance", "acceptance rate"): snap.spec_acceptance_rate,
        ("Speculative decoding acceptance", "mean acceptance length"): snap.spec_mean_acceptance_length,
        ("Running and waiting requests", "running"): 20.0, ("Running and waiting requests", "waiting"): 4.0,
        ("KV-cache usage", "{{pod}}"): 0.7,
    }
    for key, value in expected.items():
        assert values[key] == pytest.approx(value, rel=1e-6), key
    # The mean per-request breakdown is the window's: sum over count of each phase.
    where = "Where a request's time goes"
    assert values[(where, "prefill")] == pytest.approx(0.2, rel=1e-6)
    assert values[(where, "queue")] == pytest.approx((54 * 0.1 + 6 * 0.4) / 60, rel=1e-6)


def write_prometheus_config(workdir: Path, targets_file: Path) -> Path:
    job = dict(SCRAPE_CONFIG["scrape_configs"][0])
    assert "kubernetes_sd_configs" in job
    del job["kubernetes_sd_configs"]
    job["file_sd_configs"] = [{"files": [str(targets_file)], "refresh_interval": "1s"}]
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": SCRAPE_CONFIG["global"], "scrape_configs": [job]}))
    return config


def runtime_pod_labels(name: str = "llama", namespace: str = "demo") -> dict[str, str]:
    """The pod labels the operator gives a TunedModel's runtime pods (slotune.manifests.resources, the real builder)."""
    tm = parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": name, "namespace": namespace, "uid": "0000-uid"},
        "spec": {"model": {"name": "llama", "source": "hf://org/llama"},
                 "hardware": {"accelerator": "nvidia-h100-80gb", "count": 1}, "slo": {"ttft": {"p99": 500}}},
    })
    deployment = build_deployment(tm, RuntimeConfig(), OperatorSettings())
    return deployment["spec"]["template"]["metadata"]["labels"]


def pod_target(address: str, pod: str, pod_labels: dict[str, str], *, port_name: str = "http",
               phase: str = "Running") -> dict:
    """The labels Prometheus' Kubernetes pod discovery gives one container port of a pod in namespace demo."""
    meta = {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key): value
            for key, value in pod_labels.items()}
    return {"targets": [address], "labels": meta | {
        "__meta_kubernetes_namespace": "demo", "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_phase": phase, "__meta_kubernetes_pod_container_port_name": port_name,
    }}


@pytest.fixture
def scrape_job_prometheus(tmp_path: Path) -> Iterator[str]:
    targets = tmp_path / "targets.json"
    runtime = runtime_pod_labels()
    targets.write_text(json.dumps([
        pod_target("10.0.0.1:8000", "llama-runtime-1", runtime),
        pod_target("10.0.0.1:9000", "llama-runtime-1", runtime, port_name="debug"),
        pod_target("10.0.0.2:8000", "llama-runtime-2", runtime, phase="Pending"),
        pod_target("10.0.0.3:8000", "other-app", {"app.kubernetes.io/name": "other"}),
        pod_target("10.0.0.4:8000", "lookalike", runtime | {"app.kubernetes.io/managed-by": "Helm"}),
    ]))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [shutil.which("prometheus") or "prometheus", f"--config.file={write_prometheus_config(tmp_path, targets)}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def test_scrape_job_keeps_only_running_runtime_pods_on_their_http_port(scrape_job_prometheus: str) -> None:
    def targets() -> dict:
        return httpx.get(f"{scrape_job_prometheus}/api/v1/targets", timeout=5).json()["data"]

    wait_until(lambda: len(targets()["activeTargets"]) + len(targets()["droppedTargets"]) == 5)
    active = targets()["activeTargets"]
    assert [t["labels"] for t in active] == [{
        "instance": "10.0.0.1:8000", "job": "slotune-runtime", "namespace": "demo", "pod": "llama-runtime-1",
        "tunedmodel": "llama", "deployment": "llama-runtime",
    }]
    assert active[0]["scrapeUrl"] == "http://10.0.0.1:8000/metrics"
    # The operator finds these series with exactly this selector.
    operator_selector = Selector(namespace="demo", deployment=ChildNames("llama").deployment)
    assert operator_selector.promql("model_name") == '{namespace="demo",deployment="llama-runtime"}'
