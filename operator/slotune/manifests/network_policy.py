"""The NetworkPolicy each TunedModel's runtime pods get, as a pure builder: deny by default, in every install.

A chart cannot place a namespaced object in namespaces it does not know (a cluster-wide install serves every
namespace), so the operator applies this policy beside the Deployment and Service, owned by the TunedModel. It
selects that TunedModel's pods and admits: to the serving port (the OpenAI API and /metrics), the peers the cluster
admin lists (the chart's `networkPolicy.clients`; by default pods of the same namespace and Prometheus pods); to the
admin port (/admin/config, the runtime's --admin-port), the operator's own pods alone, which still need the
TunedModel's bearer token. The operator's pods are those labelled as the chart labels them, in the operator's own
namespace (read from its service account's mount; outside a cluster, any namespace).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slotune.api import TunedModel
from slotune.manifests.resources import ADMIN_PORT, RUNTIME_PORT, ChildNames, owner_reference, selector_labels
from slotune.manifests.resources import labels as child_labels

OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "slotune", "app.kubernetes.io/component": "operator"}
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def operator_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace the operator runs in, None outside a cluster."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def operator_peer(namespace: str | None) -> dict[str, Any]:
    where = {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
    return {"namespaceSelector": where, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}


def parse_peers(text: str) -> list[dict[str, Any]]:
    """The clients' NetworkPolicyPeers from the operator's setting (JSON); refuses anything but a list of objects."""
    peers = json.loads(text)
    if not isinstance(peers, list) or not all(isinstance(p, dict) for p in peers):
        raise ValueError(f"network policy clients must be a JSON list of NetworkPolicyPeer objects, not {text!r}")
    return peers


def build_network_policy(tm: TunedModel, clients: list[dict[str, Any]], namespace: str | None) -> dict[str, Any]:
    name = tm.metadata.name
    port = [{"port": RUNTIME_PORT, "protocol": "TCP"}]
    ingress = [{"from": [operator_peer(namespace)], "ports": [*port, {"port": ADMIN_PORT, "protocol": "TCP"}]}]
    if clients:
        ingress.append({"from": clients, "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": ChildNames(name).deployment, "namespace": tm.metadata.namespace or "default",
                     "labels": child_labels(name), "ownerReferences": [owner_reference(tm)]},
        "spec": {"podSelector": {"matchLabels": selector_labels(name)}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
