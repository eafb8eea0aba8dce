"""The runtime pods' NetworkPolicy, on in every install: the default `helm template` hands the operator the policy's
clients, and the policy the operator builds from what the chart rendered selects exactly the TunedModel's pods
(the canary pod included), admits the chart's operator pods to the serving and admin ports and the listed clients
to the serving port only (never /admin/config). The peers are evaluated against pod labels here; kwok runs no pod
network, so no test in this repository can show a packet being dropped (docs/security.md says so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotune.api import parse_tunedmodel
from slotune.backends.kube_canary_pod import CANARY_POD_LABEL
from slotune.manifests.network_policy import build_network_policy, operator_namespace, parse_peers
from slotune.manifests.resources import ADMIN_PORT, RUNTIME_PORT, labels, selector_labels
from slotune.settings import DEFAULT_NETWORK_POLICY_CLIENTS, OperatorSettings
from tests.unit.deploy.test_chart_operator_settings import settings_from_chart
from tests.unit.deploy.test_chart_render import one, render

NAMESPACE = "team-a"


def tunedmodel():
    return parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": "chat", "namespace": NAMESPACE, "uid": "u-1", "generation": 1},
        "spec": {"model": {"name": "m", "source": "builtin://tiny"}, "hardware": {"accelerator": "cpu", "count": 0},
                 "slo": {"ttft": {"p99": 500}}}})


def policy_from_chart(helm_binary: Path, *values: str) -> dict | None:
    settings = settings_from_chart(helm_binary, *values)
    if not settings.network_policy_clients:
        return None
    return build_network_policy(tunedmodel(), parse_peers(settings.network_policy_clients), "slotune-system")


def admits(policy: dict, port: int, namespace: str, namespace_labels: dict, pod_labels: dict) -> bool:
    """Whether `policy` lets a pod in (NetworkPolicy semantics for matchLabels peers: a rule admits a port to any
    of its peers; a peer's namespaceSelector and podSelector must both match; an absent namespaceSelector is the
    policy's own namespace)."""
    def matches(selector: dict | None, found: dict) -> bool:
        return selector is not None and selector.get("matchLabels", {}).items() <= found.items()

    def peer_admits(peer: dict) -> bool:
        in_namespace = (namespace == policy["metadata"]["namespace"] if "namespaceSelector" not in peer
                        else matches(peer["namespaceSelector"], namespace_labels))
        return in_namespace and matches(peer.get("podSelector", {}), pod_labels)

    return any(port in {p["port"] for p in rule["ports"]} and any(peer_admits(p) for p in rule["from"])
               for rule in policy["spec"]["ingress"])


def test_a_default_install_hands_the_operator_its_policy(helm_binary) -> None:
    assert OperatorSettings().network_policy_clients == DEFAULT_NETWORK_POLICY_CLIENTS  # on without the chart too
    policy = policy_from_chart(helm_binary)
    assert policy is not None and policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["metadata"]["namespace"] == NAMESPACE and policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected == selector_labels("chat")
    assert selected.items() <= (labels("chat") | {CANARY_POD_LABEL: "true"}).items()  # the canary pod too
    assert policy_from_chart(helm_binary, "--set", "networkPolicy.create=false") is None


@pytest.mark.parametrize(("who", "namespace", "pod_labels", "serving", "admin"), [
    ("the operator", "slotune-system", "operator", True, True),
    ("a pod of the TunedModel's namespace", NAMESPACE, {"app": "shell"}, True, False),
    ("a pod posing as the operator in the namespace", NAMESPACE, "operator", True, False),
    ("Prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"}, True, False),
    ("a pod of another namespace", "team-b", {"app": "shell"}, False, False),
])
def test_who_reaches_which_port(helm_binary, who, namespace, pod_labels, serving, admin) -> None:
    objects = render(helm_binary)
    if pod_labels == "operator":
        pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    policy = policy_from_chart(helm_binary)
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    assert admits(policy, RUNTIME_PORT, namespace, namespace_labels, pod_labels) is serving, who
    assert admits(policy, ADMIN_PORT, namespace, namespace_labels, pod_labels) is admin, who


def test_clients_can_be_widened(helm_binary) -> None:
    policy = policy_from_chart(helm_binary, "--set-json",
                               'networkPolicy.clients=[{"namespaceSelector":{"matchLabels":{"team":"gateway"}}}]')
    gateway = {"kubernetes.io/metadata.name": "gw", "team": "gateway"}
    assert admits(policy, RUNTIME_PORT, "gw", gateway, {"app": "envoy"})
    assert not admits(policy, ADMIN_PORT, "gw", gateway, {"app": "envoy"})
    assert not admits(policy, RUNTIME_PORT, NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, {"app": "x"})


def test_outside_a_cluster_the_operator_peer_is_any_namespace(tmp_path) -> None:
    assert operator_namespace(tmp_path / "absent") is None
    (tmp_path / "ns").write_text("ops\n")
    assert operator_namespace(tmp_path / "ns") == "ops"
    with pytest.raises(ValueError):
        parse_peers('{"podSelector": {}}')
