"""The chart's ClusterRole grants exactly the operator <-> chart contract's rules: nothing missing, nothing extra."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "slotune"
ALL_WRITE = ("get", "list", "watch", "create", "patch", "update", "delete")

# (apiGroup, resource) -> verbs, transcribed from the contract (RBAC the operator needs).
CONTRACT: dict[tuple[str, str], tuple[str, ...]] = {
    ("slotune.io", "tunedmodels"): ("get", "list", "watch", "patch", "update"),
    ("slotune.io", "tunedmodels/status"): ("get", "patch", "update"),
    ("apps", "deployments"): ALL_WRITE,
    ("", "services"): ALL_WRITE,
    ("", "secrets"): ALL_WRITE,
    ("", "pods"): ("get", "list", "watch"),
    ("", "pods/proxy"): ("get", "create"),
    ("", "events"): ("create", "patch"),
    ("events.k8s.io", "events"): ("create", "patch"),
    ("monitoring.coreos.com", "servicemonitors"): ALL_WRITE,
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("get", "list", "watch"),
    ("kopf.dev", "clusterkopfpeerings"): ("get", "list", "watch", "patch"),
    ("kopf.dev", "kopfpeerings"): ("get", "list", "watch", "patch"),
    ("coordination.k8s.io", "leases"): ("get", "list", "watch", "create", "update", "patch"),
    ("", "namespaces"): ("list", "watch"),
}


def grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) a list of PolicyRules allows; wildcards and resourceNames are refused."""
    granted = set()
    for rule in rules:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    granted.add((group, resource, verb))
    return granted


def rendered(helm_binary: Path, *values: str) -> list[dict]:
    out = subprocess.run([str(helm_binary), "template", "slotune", str(CHART), "-n", "ops", *values],
                         check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_cluster_role_grants_exactly_the_contract(helm_binary: Path) -> None:
    role = next(o for o in rendered(helm_binary) if o["kind"] == "ClusterRole")
    expected = {(g, r, v) for (g, r), verbs in CONTRACT.items() for v in verbs}
    granted = grants(role["rules"])
    assert granted - expected == set(), "granted beyond the contract"
    assert expected - granted == set(), "contract rules missing"


def test_binding_gives_the_role_to_the_operator_service_account(helm_binary: Path) -> None:
    objects = rendered(helm_binary)
    binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding")
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ops"}]


def test_rbac_and_service_account_can_be_left_to_the_user(helm_binary: Path) -> None:
    objects = rendered(helm_binary, "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                       "--set", "serviceAccount.name=provided")
    assert {o["kind"] for o in objects} == {"Deployment", "ClusterKopfPeering", "ValidatingAdmissionPolicy",
                                            "ValidatingAdmissionPolicyBinding"}
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "provided"
