"""The Prometheus examples select what the operator deploys: the ServiceMonitor example matches the operator's
runtime Services, and both examples derive the `deployment` label (NAME-runtime) the operator's PromQL selects on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from slotune.api import parse_tunedmodel
from slotune.manifests.resources import TUNEDMODEL_LABEL, ChildNames, build_service, labels

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_JOB = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape-config.yaml").read_text())["scrape_configs"][0]
SERVICE_MONITOR = yaml.safe_load((ROOT / "deploy" / "prometheus" / "servicemonitor-example.yaml").read_text())
POD_LABEL = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", TUNEDMODEL_LABEL)


def relabel_target(rules: list[dict], target: str, source_key: str, target_key: str) -> dict:
    (rule,) = [r for r in rules if r.get(target_key) == target]
    return {"source": rule[source_key], "regex": rule.get("regex", "(.*)"),
            "replacement": rule.get("replacement", "$1")}


def apply(rule: dict, value: str) -> str:
    """Prometheus' replace action: a fully anchored regex match, then $1/${1} expanded in the replacement."""
    match = re.fullmatch(rule["regex"], value)
    assert match is not None
    return re.sub(r"\$\{?(\d+)\}?", lambda m: match.group(int(m.group(1))), rule["replacement"])


@pytest.mark.parametrize(("rules", "source_key", "target_key"), [
    (SCRAPE_JOB["relabel_configs"], "source_labels", "target_label"),
    (SERVICE_MONITOR["spec"]["endpoints"][0]["relabelings"], "sourceLabels", "targetLabel"),
])
def test_deployment_label_is_the_operators_runtime_deployment_name(rules, source_key, target_key) -> None:
    rule = relabel_target(rules, "deployment", source_key, target_key)
    assert rule["source"] == [POD_LABEL]
    assert apply(rule, "chat-llama") == ChildNames("chat-llama").deployment


def test_scrape_job_keeps_on_the_operators_pod_labels() -> None:
    assert SCRAPE_JOB["kubernetes_sd_configs"] == [{"role": "pod"}]
    keeps = {tuple(r["source_labels"]): r["regex"] for r in SCRAPE_JOB["relabel_configs"] if r.get("action") == "keep"}
    for key, value in labels("chat").items():
        if key.startswith("app.kubernetes.io/") and key != "app.kubernetes.io/instance":
            meta = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            assert re.fullmatch(keeps[(meta,)], value)
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == "http"


def test_service_monitor_selects_the_operators_runtime_service() -> None:
    tm = parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "0000-uid"},
        "spec": {"model": {"name": "llama", "source": "hf://org/llama"}, "hardware": {"accelerator": "nvidia-l4"},
                 "slo": {"ttft": {"p99": 500}}},
    })
    service = build_service(tm)
    selector = SERVICE_MONITOR["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize(("rules", "source_key", "target_key"), [
    (SCRAPE_JOB["relabel_configs"], "source_labels", "target_label"),
    (SERVICE_MONITOR["spec"]["endpoints"][0]["relabelings"], "sourceLabels", "targetLabel"),
])
def test_series_carry_the_pod_name_canary_verification_groups_by(rules, source_key, target_key) -> None:
    rule = relabel_target(rules, "pod", source_key, target_key)
    assert rule["source"] == ["__meta_kubernetes_pod_name"]
    assert apply(rule, "chat-runtime-7d9f-abcde") == "chat-runtime-7d9f-abcde"
