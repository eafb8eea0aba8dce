"""The admin token is per TunedModel, never shown, and rotated when its Secret is deleted: a new Secret with a new
token, the pods restarted to read it (the template names the Secret's uid), an event that says so without the token."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from slotune.manifests.resources import TOKEN_SECRET_ANNOTATION
from tests.e2e.harness.kube import apply, events, get, install_tunedmodel_crd, scratch_namespace, wait_for
from tests.e2e.harness.operator import OperatorProcess
from tests.integration.test_operator import tunedmodel


@pytest.fixture
def namespace(kube) -> Iterator[str]:
    install_tunedmodel_crd(kube)
    with scratch_namespace(kube, "token") as name:
        yield name


def token_of(secret: dict) -> str:
    return base64.b64decode(secret["data"]["token"]).decode()


def template_uid(kube, namespace: str) -> str | None:
    deployment = get(kube, "deployment", "tok-runtime", namespace) or {}
    template = deployment.get("spec", {}).get("template", {}).get("metadata", {})
    return (template.get("annotations") or {}).get(TOKEN_SECRET_ANNOTATION)


def test_deleting_the_secret_rotates_the_token_and_restarts_the_pods(kube, namespace, tmp_path) -> None:
    operator = OperatorProcess(kube.kubeconfig, tmp_path / "operator", {"SLOTUNE_PROMETHEUS_URL": ""})
    with operator:
        apply(kube, tunedmodel("tok", namespace, tuning={"mode": "off"}))
        apply(kube, tunedmodel("other", namespace, tuning={"mode": "off"}))
        first = wait_for(lambda: get(kube, "secret", "tok-admin-token", namespace), 60, "the Secret",
                         describe=operator.log_tail)
        other = wait_for(lambda: get(kube, "secret", "other-admin-token", namespace), 60, "the other Secret")
        assert token_of(first) != token_of(other)  # one token per TunedModel
        wait_for(lambda: template_uid(kube, namespace) == first["metadata"]["uid"], 60, "the template's uid")
        kube.kubectl("rollout", "status", "deployment/tok-runtime", "-n", namespace, "--timeout=90s")

        kube.kubectl("delete", "secret", "tok-admin-token", "-n", namespace)
        second = wait_for(lambda: get(kube, "secret", "tok-admin-token", namespace), 60, "a new Secret",
                          describe=operator.log_tail)
        assert second["metadata"]["uid"] != first["metadata"]["uid"] and token_of(second) != token_of(first)
        wait_for(lambda: template_uid(kube, namespace) == second["metadata"]["uid"], 60, "pods to restart")
        kube.kubectl("rollout", "status", "deployment/tok-runtime", "-n", namespace, "--timeout=90s")
        rotated = [e for e in events(kube, namespace, "tok") if e["reason"] == "AdminTokenRotated"]
        assert len(rotated) == 1, rotated
        log = operator.log_tail(100_000)
    shown = log + " ".join(e["message"] for e in events(kube, namespace, "tok"))
    for token in (token_of(first), token_of(second), token_of(other)):
        assert token not in shown
