"""A child the API server refuses is reported with the TunedModel field its value came from: the server's message
names the Deployment's path, which no TunedModel author wrote."""

from __future__ import annotations

import pytest

from slotune.backends.child_fields import tunedmodel_fields
from slotune.backends.kube_api import KubeError
from slotune.backends.kube_deployment import ChildRefused

REFUSED = 'Deployment.apps "chat-runtime" is invalid: '


@pytest.mark.parametrize(("server", "fields"), [
    ("spec.template.spec.containers[0].resources.requests: Invalid value: \"8\": must be less than or equal to cpu "
     "limit of 4", ["spec.runtime.resources.requests"]),
    ("spec.template.spec.containers[0].resources.requests[gpus]: Invalid value: \"gpus\": must be a standard "
     "resource type or fully qualified", ["spec.runtime.resources.requests.gpus"]),
    ("[spec.template.spec.nodeSelector: Invalid value: \"bad key!\": name part must consist of ..., "
     "spec.template.spec.tolerations[0].operator: Invalid value: \"Equal\": value must be empty]",
     ["spec.hardware.nodeSelector", "spec.hardware.tolerations[0].operator"]),
    ("spec.template.spec.containers[0].image: Required value", ["spec.runtime.image"]),
    ("metadata.name: Invalid value", []),
])
def test_the_deployment_path_becomes_the_tunedmodel_field(server: str, fields: list[str]) -> None:
    assert tunedmodel_fields(REFUSED + server) == fields


def test_a_refusal_names_the_field_and_keeps_the_servers_words() -> None:
    server = ("spec.template.spec.containers[0].resources.limits[memory]: Invalid value: \"-1Gi\": must be greater "
              "than or equal to 0")
    refused = ChildRefused("Deployment", KubeError(422, REFUSED + server))
    assert str(refused).startswith(
        "the API server refused the Deployment (from the TunedModel's spec.runtime.resources.limits.memory): 422: ")
    assert server in str(refused)
    assert str(ChildRefused("Service", KubeError(422, "metadata.name: too long"))) == (
        "the API server refused the Service: 422: metadata.name: too long")
