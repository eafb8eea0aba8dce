"""Nothing stays pending, on the real control plane with the operator process: a TunedModel asking for more than
the cluster has (1,024 replicas of 8 GPUs; a ResourceQuota of 2 pods against 4 replicas) ends Degraded with a status
that says it was scaled to what fits and what was requested, its Deployment at the placed count, and no Pending pod
of it in the scheduler's queue. After a backoff the requested count is asked for again: fitted again while the quota
holds, taken back (Degraded cleared) once the quota is raised."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.harness.kube import apply, condition, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "fit") as name:
        yield name


OPERATOR_ENV = {"SLOTUNE_PROMETHEUS_URL": "", "SLOTUNE_UNSCHEDULABLE_GRACE_S": "15", "SLOTUNE_ROLLOUT_TIMEOUT_S": "600"}


def retry_at(retry: int) -> str:
    """The status' words for when the requested count is asked for again, as a pattern."""
    return r"asked for again at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(retry " + str(retry) + r"\)"


@pytest.fixture
def operator(kube, tmp_path) -> Iterator[OperatorProcess]:
    with OperatorProcess(kube.kubeconfig, tmp_path / "operator", OPERATOR_ENV) as process:
        yield process


@pytest.fixture
def retrying_operator(kube, tmp_path) -> Iterator[OperatorProcess]:
    """Retries of the requested count 10 s after a fit, then 20 s (the cap) after each that did not fit."""
    with OperatorProcess(kube.kubeconfig, tmp_path / "operator", OPERATOR_ENV | {
            "SLOTUNE_FIT_RETRY_S": "10", "SLOTUNE_FIT_RETRY_MAX_S": "20"}) as process:
        yield process


def phases(kube, namespace: str, name: str) -> dict[str, int]:
    pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", f"slotune.io/tunedmodel={name}",
                                   "-o", "json").stdout)["items"]
    found: dict[str, int] = {}
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp"):
            found[pod["status"].get("phase", "?")] = found.get(pod["status"].get("phase", "?"), 0) + 1
    return found


def degraded(kube, namespace: str, name: str, operator: OperatorProcess,
             saying: Callable[[str], bool] = lambda message: True) -> dict:
    def ended() -> dict | None:
        tm = get(kube, "tunedmodel", name, namespace)
        found = condition(tm, "Degraded")
        return tm if found and found["status"] == "True" and saying(found["message"]) else None
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


def test_a_raised_quota_gives_back_the_requested_replicas_at_the_next_retry(kube, namespace, retrying_operator) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods", "namespace": namespace},
             "spec": {"hard": {"pods": "2"}}}
    apply(kube, quota)
    apply(kube, tunedmodel("back", namespace, replicas=4, tuning={"mode": "off"}))
    tm = degraded(kube, namespace, "back", retrying_operator)
    assert "scaled to 2 of 4 requested replicas" in tm["status"]["message"], tm["status"]
    assert re.search(retry_at(1), tm["status"]["message"]), tm["status"]  # the status says when
    since = condition(tm, "Degraded")["lastTransitionTime"]

    # The first retry asks for 4 again; the quota still admits 2: fitted again, the next retry later. Degraded
    # held all along: it did not flap to False while the retry rolled out.
    tm = degraded(kube, namespace, "back", retrying_operator, lambda m: re.search(retry_at(2), m) is not None)
    assert tm["status"]["message"].startswith("retry failed: scaled to 2 of 4 requested replicas"), tm["status"]
    assert condition(tm, "Degraded")["lastTransitionTime"] == since
    deployment = get(kube, "deployment", "back-runtime", namespace)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["annotations"]["slotune.io/fit-retries"] == "1"

    apply(kube, quota | {"spec": {"hard": {"pods": "4"}}})

    def taken_back() -> dict | None:
        found = get(kube, "tunedmodel", "back", namespace)
        degraded_now = condition(found, "Degraded")
        d = get(kube, "deployment", "back-runtime", namespace)
        running = d and d["spec"]["replicas"] == 4 and d.get("status", {}).get("readyReplicas") == 4
        healthy = degraded_now and degraded_now["status"] == "False" and found["status"].get("phase") == "Measuring"
        return found if running and healthy else None
    tm = wait_for(taken_back, 300, "4 ready replicas and Degraded=False", describe=lambda: "\n".join(
        (json.dumps(get(kube, "tunedmodel", "back", namespace)["status"].get("conditions")),
         retrying_operator.log_tail())))
    assert tm["status"]["config"]["replicas"] == 4
    annotations = get(kube, "deployment", "back-runtime", namespace)["metadata"]["annotations"]
    assert "slotune.io/fit-retries" not in annotations and "slotune.io/fit-retry-at" not in annotations
    assert phases(kube, namespace, "back") == {"Running": 4}
