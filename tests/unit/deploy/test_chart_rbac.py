"""The chart's RBAC grants exactly the operator <-> chart contract's rules, nothing missing, nothing extra: a Role and
RoleBinding per watched namespace (nothing cluster-scoped) with watchNamespaces, one ClusterRole without; pods/proxy
only with the proxy transport; no Leases, no Namespaces, no update verb anywhere."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "slotune"

# (apiGroup, resource) -> verbs, transcribed from the contract (docs/security.md, the RBAC table).
NAMESPACED: dict[tuple[str, str], tuple[str, ...]] = {
    ("slotune.io", "tunedmodels"): ("get", "list", "watch", "patch"),
    ("slotune.io", "tunedmodels/status"): ("patch",),
    ("apps", "deployments"): ("get", "list", "watch", "create", "patch", "delete"),
    ("", "services"): ("create", "patch"),
    ("monitoring.coreos.com", "servicemonitors"): ("create", "patch"),
    ("", "secrets"): ("get", "list", "watch", "create"),
    ("", "pods"): ("list",),
    ("", "events"): ("create",),
    ("networking.k8s.io", "networkpolicies"): ("create", "patch"),
}
PROXY = {("", "pods/proxy"): ("get", "create")}
NAMESPACE_PEERING = {("kopf.dev", "kopfpeerings"): ("get", "list", "watch", "patch")}
CLUSTER_ONLY = {("kopf.dev", "clusterkopfpeerings"): ("get", "list", "watch", "patch"),
                ("apiextensions.k8s.io", "customresourcedefinitions"): ("list", "watch")}


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


def expected(*tables: dict[tuple[str, str], tuple[str, ...]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for table in tables for (g, r), verbs in table.items() for v in verbs}


def rendered(helm_binary: Path, *values: str) -> list[dict]:
    out = subprocess.run([str(helm_binary), "template", "slotune", str(CHART), "-n", "ops", *values],
                         check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def rbac(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]


def test_cluster_wide_install_grants_exactly_the_contract(helm_binary: Path) -> None:
    objects = rbac(rendered(helm_binary))
    assert sorted(o["kind"] for o in objects) == ["ClusterRole", "ClusterRoleBinding"]
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert grants(role["rules"]) == expected(NAMESPACED, CLUSTER_ONLY)


def test_watched_namespaces_get_roles_and_nothing_cluster_wide(helm_binary: Path) -> None:
    objects = rbac(rendered(helm_binary, "--set", "watchNamespaces={team-a,team-b}"))
    assert sorted((o["kind"], o["metadata"]["namespace"]) for o in objects) == [
        ("Role", "team-a"), ("Role", "team-b"), ("RoleBinding", "team-a"), ("RoleBinding", "team-b")]
    for role in (o for o in objects if o["kind"] == "Role"):
        assert grants(role["rules"]) == expected(NAMESPACED, NAMESPACE_PEERING)


def test_pod_proxy_only_with_the_proxy_transport(helm_binary: Path) -> None:
    for values in ((), ("--set", "watchNamespaces={team-a}")):
        direct = rbac(rendered(helm_binary, *values))
        proxied = rbac(rendered(helm_binary, *values, "--set", "adminTransport=proxy"))
        role = next(o for o in direct if o["kind"].endswith("Role"))
        with_proxy = next(o for o in proxied if o["kind"].endswith("Role"))
        assert grants(with_proxy["rules"]) - grants(role["rules"]) == expected(PROXY)


def test_no_leases_namespaces_or_updates_in_any_mode(helm_binary: Path) -> None:
    for values in ((), ("--set", "watchNamespaces={team-a}"), ("--set", "adminTransport=proxy")):
        for role in (o for o in rbac(rendered(helm_binary, *values)) if o["kind"].endswith("Role")):
            granted = grants(role["rules"])
            assert not {r for _, r, _ in granted} & {"leases", "namespaces"}
            assert not {v for _, _, v in granted} & {"update", "deletecollection", "escalate", "bind", "impersonate"}


def test_binding_gives_the_role_to_the_operator_service_account(helm_binary: Path) -> None:
    for values in ((), ("--set", "watchNamespaces={team-a}")):
        objects = rendered(helm_binary, *values)
        binding = next(o for o in objects if o["kind"].endswith("RoleBinding"))
        role = next(o for o in objects if o["kind"] in ("ClusterRole", "Role"))
        account = next(o for o in objects if o["kind"] == "ServiceAccount")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"],
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": "ops"}]


def test_no_network_policy_grant_without_the_policy(helm_binary: Path) -> None:
    role = next(o for o in rbac(rendered(helm_binary, "--set", "networkPolicy.create=false"))
                if o["kind"] == "ClusterRole")
    assert grants(role["rules"]) == expected(NAMESPACED, CLUSTER_ONLY) - expected(
        {("networking.k8s.io", "networkpolicies"): ("create", "patch")})


def test_rbac_and_service_account_can_be_left_to_the_user(helm_binary: Path) -> None:
    objects = rendered(helm_binary, "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                       "--set", "serviceAccount.name=provided")
    assert rbac(objects) == [] and not any(o["kind"] == "ServiceAccount" for o in objects)
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "provided"
