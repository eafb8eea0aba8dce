"""A look at a rollout in flight costs one list of the TunedModel's pods: a thousand TunedModels rolling out at once
(a burst of creates) look every 2-10 s, and each list is a request the API server serves before the next
TunedModels' children. The look asked for the pods twice, once for each kind of pod problem (hopeless, then
unschedulable)."""

from __future__ import annotations

from typing import Any

import yaml

from slotune.api import parse_tunedmodel
from slotune.backends.kube_deployment import KubernetesBackend
from slotune.knobs import RuntimeConfig
from slotune.settings import OperatorSettings
from tests.unit.api_cases import BASE


class _Pods:
    """The API as the rollout look uses it: a Deployment that is not rolled out yet, and its pods."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.lists = 0

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        assert kind == "Pod"
        self.lists += 1
        return self.pods


def _pod(name: str, conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def _rolling() -> dict[str, Any]:
    return {"metadata": {"generation": 1}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0}}


def _backend(pods: list[dict[str, Any]]) -> tuple[KubernetesBackend, _Pods]:
    manifest = yaml.safe_load(BASE.read_text())
    manifest["metadata"] |= {"namespace": "team-a", "generation": 1}
    api = _Pods(pods)
    return KubernetesBackend(api, parse_tunedmodel(manifest), OperatorSettings()), api  # type: ignore[arg-type]


def test_a_look_at_a_rollout_lists_the_pods_once() -> None:
    starting = _pod("a", [{"type": "PodScheduled", "status": "True"}])
    backend, api = _backend([starting])
    result = backend._rollout(_rolling(), RuntimeConfig())
    assert result is not None and result.in_progress and api.lists == 1


def test_an_unschedulable_pod_is_still_seen_from_the_one_list() -> None:
    unschedulable = _pod("b", [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                "message": "0/1 nodes are available"}])
    backend, api = _backend([unschedulable])
    result = backend._rollout(_rolling(), RuntimeConfig())
    assert result is not None and "unschedulable" in (result.reason) and api.lists == 1
