"""The chart's NetworkPolicy: one per named namespace, selecting exactly the pods slotune.manifests.resources labels,
admitting the operator's pods to the API and admin ports, and the listed clients to the API port only (never
/admin/config)."""

from __future__ import annotations

from slotune.manifests.resources import ADMIN_PORT, RUNTIME_PORT, labels
from tests.unit.test_chart_render import one, render


def policies(helm_binary, *values: str) -> list[dict]:
    return [o for o in render(helm_binary, *values) if o["kind"] == "NetworkPolicy"]


def test_one_policy_per_named_namespace(helm_binary) -> None:
    assert policies(helm_binary) == []  # all namespaces watched: none can be named
    found = policies(helm_binary, "--set", "watchNamespaces={team-a}", "--set", "networkPolicy.namespaces={team-a,b}")
    assert [p["metadata"]["namespace"] for p in found] == ["team-a", "b"]
    assert policies(helm_binary, "--set", "watchNamespaces={a}", "--set", "networkPolicy.create=false") == []


def test_selects_runtime_pods_and_admits_the_operator(helm_binary) -> None:
    objects = render(helm_binary, "--set", "watchNamespaces={team-a}", "--set-json",
                     'networkPolicy.clients=[{"namespaceSelector":{"matchLabels":{"team":"gateway"}}}]')
    policy = one(objects, "NetworkPolicy")["spec"]
    selector = policy["podSelector"]["matchLabels"]
    assert selector.items() <= labels("any").items()
    operator_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    operator_peer, clients = policy["ingress"]
    assert operator_peer["from"][0]["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert operator_peer["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "slotune-system"}
    assert clients["from"] == [{"namespaceSelector": {"matchLabels": {"team": "gateway"}}}]
    assert {p["port"] for p in operator_peer["ports"]} == {RUNTIME_PORT, ADMIN_PORT}
    assert {p["port"] for p in clients["ports"]} == {RUNTIME_PORT}
    assert policy["policyTypes"] == ["Ingress"]
