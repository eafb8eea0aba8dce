"""The test environment's parts are real: a scheduler that places GPU pods, a Prometheus that answers PromQL, helm."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Counter, start_http_server

import kwok_cluster
from tests.harness.ports import free_port

VERSIONS = dict(
    line.split("=", 1)
    for line in (Path(kwok_cluster.HACK) / "versions.env").read_text().splitlines()
    if "=" in line and not line.startswith("#")
)


def gpu_deployment(name: str, gpus: int) -> dict:
    container = {"name": "runtime", "image": "registry.invalid/runtime:latest",
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container],
                         "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                         "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]},
            },
        },
    }


def test_server_reports_the_version_we_built(kube: kwok_cluster.Cluster) -> None:
    assert kube.server_version() == VERSIONS["K8S_VERSION"]


def test_gpu_deployment_is_scheduled_onto_a_fake_gpu_node_and_runs(kube: kwok_cluster.Cluster) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps(gpu_deployment("gpu-smoke", gpus=4)))
    kube.kubectl("rollout", "status", "deployment/gpu-smoke", "--timeout=90s")
    pods = json.loads(kube.kubectl("get", "pods", "-l", "app=gpu-smoke", "-o", "json").stdout)["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] == "gpu-h100-0"
    # 2 pods x 4 GPUs fill the 8-GPU node: a third replica must stay Pending for lack of nvidia.com/gpu.
    kube.kubectl("scale", "deployment/gpu-smoke", "--replicas=3")
    deadline = time.monotonic() + 30
    reason = ""
    while time.monotonic() < deadline and "nvidia.com/gpu" not in reason:
        events = kube.kubectl("get", "events", "--field-selector", "reason=FailedScheduling", "-o", "json").stdout
        reason = " ".join(e["message"] for e in json.loads(events)["items"])
        time.sleep(0.5)
    assert "Insufficient nvidia.com/gpu" in reason
    kube.kubectl("delete", "deployment/gpu-smoke", "--wait=true")


def test_prometheus_scrapes_a_target_and_answers_promql(prometheus) -> None:
    registry = CollectorRegistry()
    served = Counter("slotune_smoke_requests", "Requests served by the smoke target.", registry=registry)
    served.inc(42)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        prom = prometheus(targets=[(f"127.0.0.1:{port}", {"deployment": "smoke"})], scrape_interval_s=0.5)
        prom.wait_for_scrapes()
        result = prom.query('slotune_smoke_requests_total{deployment="smoke"}')
        assert float(result[0]["value"][1]) == 42.0
    finally:
        server.shutdown()
        thread.join()


def test_helm_templates_a_chart(helm_binary: Path, tmp_path: Path) -> None:
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("replicas: 3\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n"
        "  replicas: {{ .Values.replicas | quote }}\n"
    )
    rendered = subprocess.run([str(helm_binary), "template", "demo", str(chart), "--set", "replicas=5"],
                              check=True, capture_output=True, text=True).stdout
    config_map = yaml.safe_load(rendered)
    assert config_map["metadata"]["name"] == "demo"
    assert config_map["data"]["replicas"] == "5"
