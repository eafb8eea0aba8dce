"""Runtime pods under Pod Security "restricted", checked by the API server itself, and the NetworkPolicy the operator
applies for each TunedModel selecting them.

The namespace enforces `restricted`, so the ReplicaSet controller's pod creations go through the PodSecurity admission
plugin of the real kube-apiserver: a runtime pod exists only if it passes. A bare pod in the same namespace is refused,
which shows the profile is enforced there. kwok has no network plugin, so the NetworkPolicy is checked by what it
selects (the API server's own label selection), not by dropping packets.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness.kube import apply, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "psa"
SYSTEM_NAMESPACE = "slotune-system"


@pytest.fixture
def restricted(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "restricted") as name:
        kube.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted",
                     "pod-security.kubernetes.io/enforce-version=latest")
        yield name


def selected(kube, namespace: str, match_labels: dict[str, str]) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in match_labels.items())
    return kube.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "name").stdout.split()


def operator_pod_template(helm_binary: Path, namespace: str) -> dict:
    """The operator's pod template as the chart renders it: the labels the runtime policies admit."""
    rendered = subprocess.run([str(helm_binary), "template", RELEASE, str(ROOT / "charts" / "slotune"),
                               "--namespace", SYSTEM_NAMESPACE, "--set", f"watchNamespaces={{{namespace}}}",
                               "--show-only", "templates/deployment.yaml"],
                              check=True, capture_output=True, text=True)
    (deployment,) = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    return deployment["spec"]["template"]


def test_runtime_pods_are_admitted_under_restricted_and_selected_by_the_network_policy(kube, helm_binary,
                                                                                      restricted, tmp_path) -> None:
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": restricted},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    refused = kube.kubectl("apply", "-f", "-", input=json.dumps(bare), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr

    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": ""})
    with operator:
        apply(kube, tunedmodel("locked", restricted, tuning={"mode": "off"}))
        vllm = {"engine": "vllm", "config": {"maxNumSeqs": 32}}  # vLLM's pods add a memory-backed /dev/shm
        apply(kube, tunedmodel("locked-vllm", restricted, runtime=vllm, replicas=1, tuning={"mode": "off"}))
        for name in ("locked", "locked-vllm"):
            wait_for(lambda n=name: get(kube, "deployment", f"{n}-runtime", restricted), 60, "the Deployment",
                     describe=operator.log_tail)
            kube.kubectl("rollout", "status", f"deployment/{name}-runtime", "-n", restricted, "--timeout=90s")
    events = json.loads(kube.kubectl("get", "events", "-n", restricted, "-o", "json").stdout)["items"]
    assert not [e["message"] for e in events if e["reason"] == "FailedCreate"]
    all_pods = kube.kubectl("get", "pods", "-n", restricted, "-o", "name").stdout.split()
    pods = [p for p in all_pods if p.startswith("pod/locked-runtime-")]
    assert len(pods) == 2 and len([p for p in all_pods if p.startswith("pod/locked-vllm-runtime-")]) == 1, all_pods

    # The operator applies each TunedModel's NetworkPolicy beside its Deployment (the API server accepted it).
    operator_pod = operator_pod_template(helm_binary, restricted)
    for name, prefix in (("locked", "pod/locked-runtime-"), ("locked-vllm", "pod/locked-vllm-runtime-")):
        policy = get(kube, "networkpolicy", f"{name}-runtime", restricted)
        assert sorted(selected(kube, restricted, policy["spec"]["podSelector"]["matchLabels"])) == sorted(
            p for p in all_pods if p.startswith(prefix))
        operator_rule, *client_rules = policy["spec"]["ingress"]
        (operator_peer,) = operator_rule["from"]
        # Run outside a cluster, the operator cannot name its namespace: any namespace, the operator's pods only.
        assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pod["metadata"]["labels"].items()
        assert {p["port"] for p in operator_rule["ports"]} == {8000, 8001}  # the API and /admin/config
        assert client_rules and all({p["port"] for p in rule["ports"]} == {8000} for rule in client_rules)
