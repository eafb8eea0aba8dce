"""The Kubernetes backend against the real scheduler: a config whose pods cannot be scheduled is a failed apply
(the loop rolls back and never tries it again), scaling back succeeds, and a restart-only knob rolls the pods.
`apply` never waits: the test asks again, as the operator's next tick would, until the answer is not in progress."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotune.api import parse_tunedmodel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.controller.status import readiness
from slotune.knobs import KVCacheDtype, RuntimeConfig
from slotune.loop import ApplyResult
from slotune.loop.protocols import ReplicaCounts
from slotune.settings import OperatorSettings
from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace
from tests.integration.test_operator import tunedmodel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "be") as name:
        yield name


def pod_names(kube, namespace: str) -> set[str]:
    pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", "slotune.io/tunedmodel=big",
                                   "-o", "json").stdout)["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


@contextlib.contextmanager
def vllm_backend(kube, namespace: str, gpus: int, settings: OperatorSettings,
                 recorded: list[tuple[str, str, bool]]) -> Iterator[tuple[KubernetesBackend, RuntimeConfig]]:
    """The backend of a TunedModel `big` (vLLM: every change goes through the Deployment, since kwok's pods run
    nothing to reconfigure live) and its initial config. No operator runs here: the test drives the backend."""
    apply(kube, tunedmodel("big", namespace, hardware={"accelerator": "nvidia-h100-80gb", "count": gpus}, replicas=1,
                           runtime={"engine": "vllm"}, tuning={"mode": "off"}))
    tm = parse_tunedmodel(get(kube, "tunedmodel", "big", namespace))
    api = KubeAPI.from_environment(str(kube.kubeconfig))
    try:
        backend = KubernetesBackend(api, tm, settings, record=lambda *event: recorded.append(event))
        yield backend, tm.spec.initial_config()
    finally:
        api.close()


def settle(backend: KubernetesBackend, config: RuntimeConfig) -> ApplyResult:
    """Ask until the rollout is over: each answer in progress is one the operator would sleep a tick on. The loop
    ends on the backend's own verdict (done, hopeless, or its rollout timeout), not on a clock of the test's."""
    while (result := backend.apply(config)).in_progress:
        time.sleep(0.5)
    return result


def test_unschedulable_replicas_fail_the_apply_and_the_previous_config_comes_back(kube, namespace) -> None:
    # 4 GPUs per replica on the one 8-GPU H100 node: two replicas fit, three do not.
    # The grace outlasts pods of other tests' namespaces still terminating on the shared node (their GPUs come
    # back within it); replicas=3 stays unschedulable however long one waits.
    settings = OperatorSettings(rollout_timeout_s=90, unschedulable_grace_s=30)
    recorded: list[tuple[str, str, bool]] = []
    with vllm_backend(kube, namespace, 4, settings, recorded) as (backend, initial):
        assert settle(backend, initial).ok
        assert settle(backend, initial.with_changes(replicas=2)).ok  # scaled, same pods kept
        assert backend.replica_counts() == ReplicaCounts(ready=2, starting=0)  # what capacity control reads
        before = pod_names(kube, namespace)

        too_many = settle(backend, initial.with_changes(replicas=3))
        assert not too_many.ok and too_many.crashed
        assert "Insufficient nvidia.com/gpu" in too_many.reason
        assert "scaled to 2 of 3 requested replicas" in too_many.reason  # the third pod is not left Pending
        assert get(kube, "deployment", "big-runtime", namespace)["spec"]["replicas"] == 2
        assert backend.replica_counts() == ReplicaCounts(ready=2, starting=0)  # the Pending third is not counted
        assert ("RolloutFailed", too_many.reason, True) in recorded

        assert settle(backend, initial.with_changes(replicas=2)).ok  # the rollback
        assert pod_names(kube, namespace) == before  # scaling never restarts a pod

        fp8 = initial.with_changes(replicas=2, kv_cache_dtype=KVCacheDtype.FP8)  # restart-only knob
        assert settle(backend, fp8).ok
        deployment = get(kube, "deployment", "big-runtime", namespace)
        assert "--kv-cache-dtype=fp8" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert backend.deployed_config() == fp8
        assert pod_names(kube, namespace).isdisjoint(before)  # new pods for the new arguments


def test_pods_a_quota_refuses_are_reported_and_fail_the_apply(kube, namespace) -> None:
    # No pod exists to carry the reason: the ReplicaSet controller's FailedCreate reaches the Deployment as its
    # ReplicaFailure condition, which the status and the failed apply must name instead of waiting out the timeout.
    apply(kube, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods", "namespace": namespace},
                 "spec": {"hard": {"pods": "0"}}})
    recorded: list[tuple[str, str, bool]] = []
    settings = OperatorSettings(rollout_timeout_s=600, unschedulable_grace_s=5)
    with vllm_backend(kube, namespace, 1, settings, recorded) as (backend, initial):
        refused = settle(backend, initial)
        assert not refused.ok and "exceeded quota" in refused.reason, refused.reason
        assert ("RolloutFailed", refused.reason, True) in recorded
        assert "scaled to 0 of 1 requested replicas" in refused.reason  # nothing left for the quota to refuse
        deployment = get(kube, "deployment", "big-runtime", namespace)
        assert deployment["spec"]["replicas"] == 0
        ready, message = readiness(deployment)
        assert not ready and "0/0 pods ready (scaled to fit: 1 requested)" in message, message
