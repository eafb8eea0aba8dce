"""What the two kinds of canary share (a live one, kube_canary; one extra pod, kube_canary_pod): what starting one
answers (`CanaryStart`), where its pod serves (`openai_endpoint`), and what they ask of the backend that runs them
(`CanaryBackend`, which `kube_deployment.KubernetesBackend` is), so neither imports the backend that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from slotune.api import TunedModel
from slotune.backends.kube_api import KubeAPI
from slotune.backends.kube_pods import AdminCall
from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.manifests.resources import RUNTIME_PORT, ChildNames
from slotune.settings import OperatorSettings


class CanaryBackend(Protocol):
    """The Kubernetes backend as the canaries use it."""

    api: KubeAPI
    tm: TunedModel
    settings: OperatorSettings
    names: ChildNames
    namespace: str
    _record: Callable[[str, str, bool], None]  # an event: reason, message, warning

    def deployment(self) -> dict[str, Any] | None: ...

    def ready_pods(self) -> list[dict[str, Any]]: ...

    def apply(self, config: RuntimeConfig) -> ApplyResult: ...

    def admin_token(self) -> str: ...

    def _hot_capable(self) -> bool: ...

    def _secret(self) -> dict[str, Any] | None: ...

    def _wrote(self) -> None: ...

    def _waited(self, what: str) -> float: ...

    def _forget(self, *prefixes: str) -> None: ...

    def _call_admin(self, pod: dict[str, Any], method: str, payload: dict[str, Any] | None,
                    token: str) -> AdminCall: ...


@dataclass(frozen=True)
class CanaryStart:
    pod: str
    result: ApplyResult  # how sending the candidate to the canary pod went (in progress, ok, failed)
    endpoint: str | None = None  # the canary pod's OpenAI endpoint (base URL), once it has a pod


def openai_endpoint(backend: CanaryBackend, pod: dict[str, Any]) -> str | None:
    """A pod's OpenAI base URL, as the quality gate reaches the ready pods: the pod endpoints file where one is set
    (tests, a laptop), else the pod IP; None for a pod with neither yet."""
    if backend.settings.pod_endpoints_file is not None:
        listed = backend.settings.pod_endpoints().get(f"{backend.namespace}/{pod['metadata']['name']}")
        return listed.rstrip("/") if listed else None
    ip = (pod.get("status") or {}).get("podIP")
    return f"http://{ip}:{RUNTIME_PORT}" if ip else None
