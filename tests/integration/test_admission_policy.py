"""The runtime policy on the real API server: the chart's ValidatingAdmissionPolicy refuses the evil image, the
overriding extraArgs and --trust-remote-code with the same messages as the operator's twin (the shared cases of
tests/unit/runtime_policy_cases.py); without the policy installed, the operator refuses the same TunedModel itself:
Degraded with the rule named, and no child created."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness.kube import apply, condition, events, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.unit.runtime_policy_cases import DEFAULT_POLICY_CASES, STRICT_ARGS_CASES, PolicyCase, message

ROOT = Path(__file__).resolve().parents[2]
EVIL = PolicyCase("evil-image", {"image": "evil.example.com/cryptominer:latest"}, "image")


def manifest(case: PolicyCase, namespace: str) -> dict:
    return {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": case.name, "namespace": namespace},
        "spec": {"model": {"name": "m", "source": "hf://org/model"} | case.model,
                 "hardware": {"accelerator": "nvidia-l4"}, "slo": {"ttft": {"p99": 500}},
                 "runtime": case.runtime, "tuning": {"mode": "off"}},
    }


def policy_objects(helm_binary: Path, *values: str) -> list[dict]:
    rendered = subprocess.run([str(helm_binary), "template", "adm", str(ROOT / "charts" / "slotune"),
                               "--show-only", "templates/admission-policy.yaml", *values],
                              check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def server_dry_run(kube, case: PolicyCase, namespace: str) -> subprocess.CompletedProcess:
    return kube.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(manifest(case, namespace)),
                        check=False)


def install(kube, objects: list[dict], namespace: str, probe: PolicyCase) -> None:
    """Apply the policy and wait until the API server enforces it (policies reach admission a moment later)."""
    for obj in objects:
        apply(kube, obj)
    wait_for(lambda: f"(runtime policy rule {probe.refused_by})" in server_dry_run(kube, probe, namespace).stderr,
             60, f"the policy to refuse {probe.name}")


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "adm") as name:
        yield name


def check_cases(kube, cases: tuple[PolicyCase, ...], namespace: str) -> None:
    for case in cases:
        result = server_dry_run(kube, case, namespace)
        if case.refused_by is None:
            assert result.returncode == 0, (case.name, result.stderr)
        else:
            assert result.returncode != 0, case.name
            assert message(case) in result.stderr, (case.name, result.stderr)


def test_the_api_server_refuses_what_the_policy_forbids(kube, helm_binary, namespace) -> None:
    objects = policy_objects(helm_binary)
    older = PolicyCase("older", {"image": "evil.example.com/cryptominer:latest"}, "image")
    apply(kube, manifest(older, namespace))  # written before the policy was installed
    try:
        install(kube, objects, namespace, EVIL)
        # A TunedModel older than the policy still takes metadata patches (the operator's finalizer on deletion) ...
        kube.kubectl("label", "tunedmodel", older.name, "-n", namespace, "team=a")
        kube.kubectl("patch", "tunedmodel", older.name, "-n", namespace, "--type=merge",
                     "-p", '{"metadata":{"finalizers":["slotune.io/finalizer"]}}')
        kube.kubectl("patch", "tunedmodel", older.name, "-n", namespace, "--type=merge",
                     "-p", '{"metadata":{"finalizers":null}}')
        # ... but not a spec that still breaks the policy.
        edited = kube.kubectl("patch", "tunedmodel", older.name, "-n", namespace, "--type=merge",
                              "-p", '{"spec":{"replicas":2}}', check=False)
        assert edited.returncode != 0 and message(older) in edited.stderr, edited.stderr
        check_cases(kube, DEFAULT_POLICY_CASES, namespace)
        strict = policy_objects(helm_binary, "--set", "runtimePolicy.allowExtraArgs=false",
                                "--set", "runtimePolicy.allowRemoteCode=true")
        install(kube, strict, namespace, STRICT_ARGS_CASES[1])
        check_cases(kube, STRICT_ARGS_CASES, namespace)
        refused = kube.kubectl("apply", "-f", "-", input=json.dumps(manifest(EVIL, namespace)), check=False)
        assert refused.returncode != 0 and get(kube, "tunedmodel", EVIL.name, namespace) is None
    finally:
        for obj in objects:
            kube.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")


def test_without_the_policy_the_operator_refuses_before_any_child(kube, namespace, tmp_path) -> None:
    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": ""})
    override = PolicyCase("override", {"extraArgs": ["--port", "9999", "--admin-token-file", "/etc/hostname"]},
                          "operatorFlag", "--port")
    with operator:
        for case in (EVIL, override):
            apply(kube, manifest(case, namespace))
        for case in (EVIL, override):
            degraded = wait_for(lambda c=case: (d := condition(get(kube, "tunedmodel", c.name, namespace),
                                                               "Degraded")) and d["status"] == "True" and d,
                                60, f"{case.name} Degraded", describe=operator.log_tail)
            assert message(case) in degraded["message"], degraded
            reasons = {e["reason"] for e in events(kube, namespace, case.name)}
            assert "PolicyRefused" in reasons and "Deployed" not in reasons, reasons
    for kind in ("deployment", "service", "secret"):
        names = kube.kubectl("get", kind, "-n", namespace, "-o", "name").stdout.split()
        assert not [n for n in names if n.split("/")[1].startswith(("evil-image-", "override-"))], names
