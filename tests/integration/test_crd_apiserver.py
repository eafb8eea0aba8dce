"""The generated CRD on a real kube-apiserver: examples apply with defaults, bad manifests are refused with the field
and the rule, `kubectl explain` teaches, and `kubectl get tm` shows status written through the status subresource."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import yaml

import kwok_cluster
from slotune.api import (
    GROUP,
    PLURAL,
    VERSION,
    DiagnosisReport,
    FieldError,
    InvalidTunedModel,
    Observed,
    Percentiles,
    Phase,
    TunedModelSpec,
    TunedModelStatus,
    load_tunedmodel,
    parse_tunedmodel,
)
from slotune.api.rules import ApiModel
from slotune.api.schema import reachable_models
from slotune.commands.crdgen import CRD_PATH
from slotune.knobs import RuntimeConfig
from tests.unit.api_cases import EXAMPLES, invalid_cases

NAMESPACE = "slotune-api-tests"


@pytest.fixture(scope="module")
def cluster(kube: kwok_cluster.Cluster) -> Iterator[kwok_cluster.Cluster]:
    kube.kubectl("apply", "-f", str(CRD_PATH))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{PLURAL}.{GROUP}")
    kube.kubectl("create", "namespace", NAMESPACE)
    try:
        yield kube
    finally:
        kube.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def get_json(cluster: kwok_cluster.Cluster, name: str) -> dict:
    return json.loads(cluster.kubectl("get", "tm", name, "-n", NAMESPACE, "-o", "json").stdout)


def without_workload(spec: dict) -> dict:
    # The workload profile fills lengths and arrivals in Python only (they depend on the profile); compare the rest.
    return {k: v for k, v in spec.items() if k != "workload"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_applies_and_reads_back_with_the_same_defaults_as_python(cluster, path) -> None:
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(path))
    local = load_tunedmodel(path)
    stored = get_json(cluster, local.metadata.name)
    assert without_workload(stored["spec"]) == without_workload(local.wire()["spec"])
    assert stored["spec"]["tuning"]["bounds"]["numSpeculativeTokens"] == {"min": 1, "max": 8}  # a default
    assert parse_tunedmodel(stored).spec == local.spec


OWN_RULE_MESSAGES = tuple(r.message for m in reachable_models(TunedModelSpec).values() if issubclass(m, ApiModel)
                          for r in m.RULES)


def python_error(case) -> FieldError:
    with pytest.raises(InvalidTunedModel) as refused:
        parse_tunedmodel(case.manifest)
    return next(e for e in refused.value.errors if e.path == case.path)


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda c: c.name)
def test_invalid_manifest_is_refused_naming_field_and_rule(cluster, case) -> None:
    result = cluster.kubectl("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(case.manifest), check=False)
    assert result.returncode != 0, f"{case.name} was accepted"
    assert case.path in result.stderr and case.server_message in result.stderr, result.stderr
    assert cluster.kubectl("get", "tm", case.name, "-n", NAMESPACE, check=False).returncode != 0
    local = python_error(case)
    if local.message.startswith(OWN_RULE_MESSAGES):
        # One Rule, two enforcers: the API server's line is the loader's, values included.
        assert f'{case.path}: Invalid value: "object": {local.message}' in result.stderr, result.stderr


def explain(cluster: kwok_cluster.Cluster, field: str, timeout_s: float = 60) -> str:
    """The CRD's OpenAPI reaches the aggregated spec a moment after the CRD is Established."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = cluster.kubectl("explain", field, check=False)
        if result.returncode == 0 or time.monotonic() > deadline:
            return result.stdout + result.stderr
        time.sleep(1)


def test_kubectl_explain_teaches_the_slo(cluster) -> None:
    text = " ".join(explain(cluster, "tunedmodel.spec.slo").split())
    assert "Latency targets (milliseconds) every window must meet" in text
    for field in ("ttft", "tpot", "e2e", "attainment", "minThroughput"):
        assert field in text
    assert "Time to first token targets." in text
    bounds = " ".join(explain(cluster, "tunedmodel.spec.tuning.bounds.maxReplicas").split())
    assert "Most replicas the tuner may scale up to" in bounds and "From 1 to 1024." in bounds


def written_status() -> TunedModelStatus:
    return TunedModelStatus(
        phase=Phase.TUNING, slo_met=False, iteration=3,
        observed=Observed(window_s=60, num_requests=512, ttft=Percentiles(p50_ms=120, p95_ms=610, p99_ms=812.5),
                          tpot=Percentiles(p50_ms=18, p99_ms=31.25)),
        diagnosis=DiagnosisReport(bottleneck="capacity", evidence=["queue time is 74% of TTFT p99"]),
        config=RuntimeConfig(max_num_seqs=64), best_config=RuntimeConfig(max_num_seqs=64),
    )


def test_status_subresource_feeds_the_printer_columns(cluster) -> None:
    from kubernetes import client

    manifest = yaml.safe_load((EXAMPLES[0].parent / "chat-h100.yaml").read_text())
    manifest["metadata"] = {"name": "status-view", "namespace": NAMESPACE}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    status = written_status()
    api = client.CustomObjectsApi(cluster.api_client())
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, PLURAL, "status-view",
        {"status": status.model_dump(by_alias=True, mode="json", exclude_none=True)},
    )
    header, row = cluster.kubectl("get", "tm", "status-view", "-n", NAMESPACE).stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "SLO", "MET", "TTFT", "P99", "TPOT", "P99", "BOTTLENECK",
                              "ITERATION", "AGE"]
    assert row.split()[:7] == ["status-view", "Tuning", "false", "812.5", "31.25", "capacity", "3"]
    stored = get_json(cluster, "status-view")
    assert TunedModelStatus.model_validate(stored["status"]) == status


def test_status_is_not_writable_through_the_main_resource(cluster) -> None:
    manifest = yaml.safe_load((EXAMPLES[0].parent / "chat-h100.yaml").read_text())
    manifest["metadata"] = {"name": "status-guard", "namespace": NAMESPACE}
    manifest["status"] = {"phase": "Converged"}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    cluster.kubectl("patch", "tm", "status-guard", "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"status": {"phase": "Converged"}}))
    # With a status subresource the main resource ignores status: only the loop's writes to /status land.
    assert "status" not in get_json(cluster, "status-guard")
