"""Nothing stays pending, on the real control plane with the operator process: a TunedModel asking for more than
the cluster has (1,024 replicas of 8 GPUs; a ResourceQuota of 2 pods against 4 replicas) ends Degraded with a status
that says it was scaled to what fits and what was requested, its Deployment at the placed count, and no Pending pod
of it in the scheduler's queue."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.harness.kube import apply, condition, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "fit") as name:
        yield name


@pytest.fixture
def operator(kube, tmp_path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {
        "SLOTUNE_PROMETHEUS_URL": "", "SLOTUNE_UNSCHEDULABLE_GRACE_S": "15", "SLOTUNE_ROLLOUT_TIMEOUT_S": "600"})
    with process:
        yield process


def phases(kube, namespace: str, name: str) -> dict[str, int]:
    pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", f"slotune.io/tunedmodel={name}",
                                   "-o", "json").stdout)["items"]
    found: dict[str, int] = {}
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp"):
            found[pod["status"].get("phase", "?")] = found.get(pod["status"].get("phase", "?"), 0) + 1
    return found


def degraded(kube, namespace: str, name: str, operator: OperatorProcess) -> dict:
    def ended() -> dict | None:
        tm = get(kube, "tunedmodel", name, namespace)
        found = condition(tm, "Degraded")
        return tm if found and found["status"] == "True" else None
    return wait_for(ended, 300, "Degraded=True", describe=operator.log_tail)


def test_an_oversize_request_ends_with_no_pending_pod_and_says_so(kube, namespace, operator) -> None:
    apply(kube, tunedmodel("huge", namespace, hardware={"accelerator": "nvidia-h100-80gb", "count": 8},
                           replicas=1024, runtime={"engine": "vllm"}, tuning={"mode": "off"}))
    tm = degraded(kube, namespace, "huge", operator)
    assert "of 1024 requested replicas, no pod left Pending" in tm["status"]["message"], tm["status"]
    assert "Insufficient nvidia.com/gpu" in tm["status"]["message"]
    assert tm["status"]["config"]["replicas"] == 1024  # the request is kept
    wait_for(lambda: "Pending" not in phases(kube, namespace, "huge"), 120, "no Pending pod",
             describe=lambda: json.dumps(phases(kube, namespace, "huge")))
    deployment = get(kube, "deployment", "huge-runtime", namespace)
    assert deployment["spec"]["replicas"] <= 1  # the session's one 8-GPU node holds one replica at most
    assert deployment["metadata"]["annotations"]["slotune.io/requested-replicas"] == "1024"
    ready = condition(get(kube, "tunedmodel", "huge", namespace), "Ready")
    assert "(scaled to fit: 1024 requested)" in ready["message"], ready


def test_a_quota_scales_the_deployment_to_the_pods_it_admits(kube, namespace, operator) -> None:
    apply(kube, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "two-pods", "namespace": namespace},
                 "spec": {"hard": {"pods": "2"}}})
    apply(kube, tunedmodel("quota", namespace, replicas=4, tuning={"mode": "off"}))
    tm = degraded(kube, namespace, "quota", operator)
    assert "scaled to 2 of 4 requested replicas" in tm["status"]["message"], tm["status"]
    assert "exceeded quota" in tm["status"]["message"]
    deployment = wait_for(lambda: (d := get(kube, "deployment", "quota-runtime", namespace))
                          and d.get("status", {}).get("readyReplicas") == 2 and d, 120, "2 ready pods")
    assert deployment["spec"]["replicas"] == 2
    assert phases(kube, namespace, "quota") == {"Running": 2}
