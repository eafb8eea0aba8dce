"""The operator on the real control plane: children, GPU scheduling on kwok nodes, status, events, garbage collection,
and Prometheus being down. The operator runs as a real `slotune operator` subprocess (tests/e2e/harness/operator.py).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness.kube import apply, condition, events, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.harness.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def tunedmodel(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A TunedModel for kwok's fake pods, where no runtime answers /admin/config: hotReconfigure off, so the pods
    run the Deployment's arguments and the operator has nothing to read back (the e2e tests read back real pods).
    CPU pods by default: the session's one 8-GPU H100 node is for the tests about GPUs, so other tests' pods (their
    namespaces still terminating) never leave a later test's pods unschedulable."""
    tuning = {"windowSeconds": 5, "minSamples": 10, "warmupSeconds": 0, "cooldownSeconds": 0, "hotReconfigure": False}
    spec = spec | {"tuning": tuning | spec.get("tuning", {})}
    return {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "llama-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "hardware": {"accelerator": "cpu", "count": 0},
            "slo": {"ttft": {"p99": 500}, "tpot": {"p99": 50}},
            "runtime": {"config": {"maxNumSeqs": 32}},
            "replicas": 2,
        } | spec,
    }


@pytest.fixture(scope="module")
def crd(kube) -> None:
    install_tunedmodel_crd(kube)


@pytest.fixture
def namespace(kube, crd) -> Iterator[str]:
    with scratch_namespace(kube, "op") as name:
        yield name


@pytest.fixture
def operator(kube, tmp_path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": ""})
    with process:
        yield process
    print(process.log_tail())


def runtime_container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_tunedmodel_gets_owned_children_on_gpu_nodes_and_a_status(kube, namespace, operator) -> None:
    apply(kube, tunedmodel("chat", namespace, hardware={"accelerator": "nvidia-h100-80gb", "count": 2},
                           tuning={"mode": "off", "windowSeconds": 5, "minSamples": 10}))
    describe = operator.log_tail
    deployment = wait_for(lambda: get(kube, "deployment", "chat-runtime", namespace), 60, "the Deployment",
                          describe=describe)
    service = wait_for(lambda: get(kube, "service", "chat-runtime", namespace), 30, "the Service")
    secret = wait_for(lambda: get(kube, "secret", "chat-admin-token", namespace), 30, "the Secret")
    owner = get(kube, "tunedmodel", "chat", namespace)
    for child in (deployment, service, secret):
        (reference,) = child["metadata"]["ownerReferences"]
        assert (reference["kind"], reference["uid"]) == ("TunedModel", owner["metadata"]["uid"])
        assert child["metadata"]["labels"]["slotune.io/tunedmodel"] == "chat"
    args = runtime_container(deployment)["args"]
    assert "--max-num-seqs=32" in args and "--admin-token-file" in args
    assert runtime_container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert len(base64.b64decode(secret["data"]["token"])) >= 32

    kube.kubectl("rollout", "status", "deployment/chat-runtime", "-n", namespace, "--timeout=90s")
    pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", "slotune.io/tunedmodel=chat",
                                   "-o", "json").stdout)["items"]
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {"gpu-h100-0"}

    ready = wait_for(lambda: (c := condition(get(kube, "tunedmodel", "chat", namespace), "Ready"))
                     and c["status"] == "True" and c, 60, "Ready=True", describe=describe)
    assert (ready["reason"], ready["message"]) == ("PodsReady", "2/2 pods ready")
    status = get(kube, "tunedmodel", "chat", namespace)["status"]
    metrics = condition({"status": status}, "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "NoPrometheus")
    assert condition({"status": status}, "Tuning")["status"] == "False"
    assert {c["type"] for c in status["conditions"]} == {"Ready", "SLOMet", "Tuning", "MetricsAvailable", "Degraded"}
    assert status["phase"] == "Measuring"
    printed = kube.kubectl("get", "tunedmodel", "chat", "-n", namespace).stdout
    assert "PHASE" in printed.splitlines()[0] and "Measuring" in printed
    assert "Deployed" in {e["reason"] for e in events(kube, namespace, "chat")}


def test_deleting_the_tunedmodel_deletes_its_children(kube, namespace, operator) -> None:
    apply(kube, tunedmodel("gone", namespace, tuning={"mode": "off", "windowSeconds": 5, "minSamples": 10}))
    wait_for(lambda: get(kube, "deployment", "gone-runtime", namespace), 60, "the Deployment",
             describe=operator.log_tail)
    kube.kubectl("delete", "tunedmodel", "gone", "-n", namespace, "--timeout=60s")
    for kind, name in (("deployment", "gone-runtime"), ("service", "gone-runtime"), ("secret", "gone-admin-token")):
        wait_for(lambda kind=kind, name=name: get(kube, kind, name, namespace) is None, 60, f"{kind} {name} gone")


def test_spec_change_rolls_out_the_new_starting_config(kube, namespace, operator) -> None:
    manifest = tunedmodel("edit", namespace, tuning={"mode": "off", "windowSeconds": 5, "minSamples": 10})
    apply(kube, manifest)
    wait_for(lambda: get(kube, "deployment", "edit-runtime", namespace), 60, "the Deployment",
             describe=operator.log_tail)
    manifest["spec"]["runtime"] = {"config": {"maxNumSeqs": 8, "enablePrefixCaching": False}}
    apply(kube, manifest)

    def rolled() -> bool:
        args = runtime_container(get(kube, "deployment", "edit-runtime", namespace))["args"]
        return "--max-num-seqs=8" in args and "--no-enable-prefix-caching" in args

    wait_for(rolled, 60, "the new args", describe=operator.log_tail)


def test_prometheus_down_keeps_the_config_and_says_metrics_unavailable(kube, namespace, tmp_path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens here: connection refused, like a Prometheus outage
    process = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": closed})
    with process:
        apply(kube, tunedmodel("blind", namespace))

        def unavailable() -> dict[str, Any] | None:
            found = condition(get(kube, "tunedmodel", "blind", namespace), "MetricsAvailable")
            return found if found and found["status"] == "False" else None

        found = wait_for(unavailable, 60, "MetricsAvailable=False", describe=process.log_tail)
        assert found["reason"] == "PrometheusUnreachable"
        # A few more windows: still nothing changed.
        wait_for(lambda: "Reconfigured" not in {e["reason"] for e in events(kube, namespace, "blind")}
                 and len(events(kube, namespace, "blind")) >= 2, 30, "events")
        status = get(kube, "tunedmodel", "blind", namespace)["status"]
    assert status["config"]["maxNumSeqs"] == 32
    assert status.get("history", []) == []
    args = runtime_container(get(kube, "deployment", "blind-runtime", namespace))["args"]
    assert "--max-num-seqs=32" in args
    assert "MetricsUnavailable" in {e["reason"] for e in events(kube, namespace, "blind")}


def test_a_child_the_api_server_refuses_is_degraded_with_its_message_not_retried(kube, namespace, operator) -> None:
    # The CRD accepts any nodeSelector key; the Deployment's own validation refuses this one.
    hardware = {"accelerator": "nvidia-h100-80gb", "count": 1, "nodeSelector": {"bad key!": "x"}}
    apply(kube, tunedmodel("refused", namespace, hardware=hardware))

    def degraded() -> dict[str, Any] | None:
        found = condition(get(kube, "tunedmodel", "refused", namespace), "Degraded")
        return found if found and found["status"] == "True" else None

    found = wait_for(degraded, 60, "Degraded=True", describe=operator.log_tail)
    status = get(kube, "tunedmodel", "refused", namespace)["status"]
    assert status["phase"] == "Degraded"
    for text in ("refused the Deployment", "nodeSelector", "bad key!"):
        assert text in found["message"], found
    assert get(kube, "deployment", "refused-runtime", namespace) is None
    refusals = [e for e in events(kube, namespace, "refused") if e["reason"] == "ChildRefused"]
    assert refusals and all(e["type"] == "Warning" for e in refusals)
    # A refused child is a fault of the spec: nothing retries it every tick. Wait for the operator to have handled
    # a later TunedModel (progress, not a clock), then count again.
    apply(kube, tunedmodel("later", namespace, tuning={"mode": "off"}))
    wait_for(lambda: get(kube, "deployment", "later-runtime", namespace), 60, "a later TunedModel deployed")
    again = [e for e in events(kube, namespace, "refused") if e["reason"] == "ChildRefused"]
    assert len(again) == len(refusals) <= 2, again
