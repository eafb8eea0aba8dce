"""The canary on Kubernetes: one ready pod runs the candidate config while its siblings keep the running one.

Which pod is the canary, and what it runs, is an annotation on the Deployment (`slotune.io/canary`), never memory of
the operator's: the backend's read-back of every ready pod (`KubernetesBackend._sync_pods`) wants the canary's config
on that pod and the running config on every other, so the invariant reads "every ready pod runs the config the
status says it runs", and an operator restarted mid-canary repairs the same split. Ending the canary removes the
annotation; the next `apply` then brings every pod to one config: the candidate (promote: only the siblings are
sent anything) or the running one (roll back: only the canary pod is). A canary is started only for a change the
pods take live (builtin engine, hotReconfigure, no restart-only knob, same replica count) with two or more ready
pods; a change that needs a restart is a canary on one extra pod of its own Deployment where the bounds leave room
(backends.kube_canary_pod); anything else is verified before/after. A started canary names its pod's OpenAI
endpoint, where the quality gate probes a change that can alter outputs on the canary pod alone (the Service
would mix both configs' answers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slotune.backends.kube_api import object_path
from slotune.backends.kube_canary_pod import (
    CANARY_GENERATION_ANNOTATION,
    canary_deployment,
    delete_extra_pod,
    start_extra_pod,
)
from slotune.knobs import RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.manifests.resources import RUNTIME_PORT

if TYPE_CHECKING:
    from slotune.backends.kube_deployment import KubernetesBackend

CANARY_ANNOTATION = "slotune.io/canary"


@dataclass(frozen=True)
class CanaryAssignment:
    pod: str
    config: RuntimeConfig
    generation: int | None = None  # the TunedModel spec generation whose loop started it (None: not recorded)

    def annotation(self) -> str:
        return json.dumps({"pod": self.pod, "config": self.config.model_dump(mode="json"),
                           "generation": self.generation}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def of(cls, deployment: dict[str, Any] | None) -> CanaryAssignment | None:
        """The canary the Deployment's annotation names, None when there is none."""
        text = (((deployment or {}).get("metadata") or {}).get("annotations") or {}).get(CANARY_ANNOTATION)
        if not text:
            return None
        found = json.loads(text)
        return cls(found["pod"], RuntimeConfig.model_validate(found["config"]), found.get("generation"))


@dataclass(frozen=True)
class CanaryStart:
    pod: str
    result: ApplyResult  # how sending the candidate to the canary pod went (in progress, ok, failed)
    endpoint: str | None = None  # the canary pod's OpenAI endpoint (base URL), once it has a pod


def openai_endpoint(backend: KubernetesBackend, pod: dict[str, Any]) -> str | None:
    """A pod's OpenAI base URL, as the quality gate reaches the ready pods: the pod endpoints file where one is set
    (tests, a laptop), else the pod IP; None for a pod with neither yet."""
    if backend.settings.pod_endpoints_file is not None:
        listed = backend.settings.pod_endpoints().get(f"{backend.namespace}/{pod['metadata']['name']}")
        return listed.rstrip("/") if listed else None
    ip = (pod.get("status") or {}).get("podIP")
    return f"http://{ip}:{RUNTIME_PORT}" if ip else None


def start_canary(backend: KubernetesBackend, running: RuntimeConfig, candidate: RuntimeConfig) -> CanaryStart | None:
    """Send `candidate` to one ready pod (the first by name; the one already named when asked again), the siblings
    untouched; a change that needs a restart runs on one extra pod instead (backends.kube_canary_pod). None when
    this change cannot be a canary: another replica count, fewer than two pods ready for a live one, no room for
    an extra pod for a restart."""
    deployment = backend.deployment()
    if deployment is None or candidate.replicas != running.replicas:
        return None
    if not backend._hot_capable() or running.needs_restart(candidate):
        return start_extra_pod(backend, running, candidate)  # the pods cannot take it live: one more pod runs it
    if running.replicas < 2:
        return None
    existing = CanaryAssignment.of(deployment)
    ready = {p["metadata"]["name"]: p for p in backend.ready_pods()}
    if existing is not None and existing.config == candidate:
        pod = existing.pod
    else:
        if len(ready) < 2:
            return None
        pod = min(ready)
        _annotate(backend, CanaryAssignment(pod, candidate, backend.tm.metadata.generation).annotation())
    return CanaryStart(pod, backend.apply(running), openai_endpoint(backend, ready[pod]) if pod in ready else None)


def end_canary(backend: KubernetesBackend) -> None:
    """Forget the canary: the next apply brings every pod to the config it is asked for."""
    if CanaryAssignment.of(backend.deployment()) is not None:
        _annotate(backend, None)
    delete_extra_pod(backend)


def end_stale_canary(backend: KubernetesBackend) -> bool:
    """A canary started by the loop of an earlier spec generation is ended: a new generation starts a new loop,
    which knows nothing of it, so the canary pod would keep the old candidate (the pod-config invariant reads the
    annotation) and an extra canary pod would keep serving beside the new config. The annotation goes (the new
    loop's first apply brings the canary pod to its config) and the canary Deployment is deleted. An operator
    restarted within one generation resumes its canary: nothing is ended then. True when something was ended."""
    generation = backend.tm.metadata.generation
    ended = False
    live = CanaryAssignment.of(backend.deployment())
    if live is not None and live.generation is not None and live.generation != generation:
        _annotate(backend, None)
        ended = True
    extra = canary_deployment(backend)
    started_by = (((extra or {}).get("metadata") or {}).get("annotations") or {}).get(CANARY_GENERATION_ANNOTATION)
    if extra is not None and started_by is not None and started_by != str(generation):
        ended = delete_extra_pod(backend) or ended
    if ended:
        backend._record("CanaryEnded", f"the spec changed (generation {generation}): the canary of an earlier "
                        "generation was ended", False)
    return ended


def _annotate(backend: KubernetesBackend, value: str | None) -> None:
    backend._wrote()
    path = object_path("Deployment", backend.namespace, backend.names.deployment)
    backend.api.merge_patch(path, {"metadata": {"annotations": {CANARY_ANNOTATION: value}}})
