"""A canary that needs a restart: one extra pod of the candidate config, in its own Deployment, beside the others.

A change the pods cannot take live (hotReconfigure off, the vLLM engine, a restart-only knob) cannot go to one
running pod by `/admin/config`. Where the bounds allow one more pod (replicas + 1 <= maxReplicas; maxReplicas absent
means spec.replicas, so by default there is no room), the candidate runs as a second Deployment `<name>-canary`:
one replica, the candidate's pod template, the pod labels the Service selects (so traffic splits over N + 1 pods)
plus `slotune.io/canary-pod`, owned by the TunedModel (garbage-collected with it). The main Deployment's pods are
never touched while it runs. Its pod is compared with the main pods over the same windows, as a live canary is
(slotune.judge.canary, per-pod PromQL: the ServiceMonitor's `deployment` label is the same constant for both).
Promote: the canary Deployment is deleted and the main Deployment rolls to the candidate (the loop's apply).
Roll back: the canary Deployment is deleted alone.

The state is the Deployment itself: its config annotation says what it runs, so an operator restarted mid-canary
finds it and goes on (a canary Deployment of another config is a leftover and is deleted). The main Deployment's
pod list (`KubernetesBackend.pods`) leaves the canary's pod out, so the pod-config invariant (every main pod runs
the status' config) and the status' replica counts (the main Deployment's) never count it; the status names it in
`status.canary` while it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotune.backends.kube_api import KubeError, object_path
from slotune.knobs import Engine, RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.manifests.resources import build_deployment, config_from_annotation, selector_labels

if TYPE_CHECKING:
    from slotune.backends.kube_canary import CanaryStart
    from slotune.backends.kube_deployment import KubernetesBackend

CANARY_POD_LABEL = "slotune.io/canary-pod"
CANARY_GENERATION_ANNOTATION = "slotune.io/canary-generation"  # the spec generation whose loop started it


def canary_deployment_name(tunedmodel: str) -> str:
    return f"{tunedmodel}-canary"


def room_for_one_more(backend: KubernetesBackend, running: RuntimeConfig) -> bool:
    """replicas + 1 <= maxReplicas (spec.tuning.bounds.maxReplicas, or spec.replicas when absent)."""
    spec = backend.tm.spec
    bound = spec.tuning.bounds.max_replicas or spec.replicas
    return running.replicas + 1 <= bound


def build_canary_deployment(backend: KubernetesBackend, candidate: RuntimeConfig, token_uid: str) -> dict[str, Any]:
    """The main Deployment's manifest for `candidate`, one replica, renamed, its pods marked as the canary's."""
    manifest = build_deployment(backend.tm, candidate.with_changes(replicas=1), backend.settings, token_uid)
    manifest["metadata"]["name"] = canary_deployment_name(backend.tm.metadata.name)
    manifest["metadata"]["labels"] = {**manifest["metadata"]["labels"], CANARY_POD_LABEL: "true"}
    manifest["metadata"]["annotations"] = {**(manifest["metadata"].get("annotations") or {}),
                                           CANARY_GENERATION_ANNOTATION: str(backend.tm.metadata.generation)}
    spec = manifest["spec"]
    spec["selector"] = {"matchLabels": {**spec["selector"]["matchLabels"], CANARY_POD_LABEL: "true"}}
    template = spec["template"]["metadata"]
    template["labels"] = {**template["labels"], CANARY_POD_LABEL: "true"}
    return manifest


def canary_deployment(backend: KubernetesBackend) -> dict[str, Any] | None:
    return backend.api.get(object_path("Deployment", backend.namespace, canary_deployment_name(
        backend.tm.metadata.name)))


def canary_pods(backend: KubernetesBackend) -> list[dict[str, Any]]:
    labels = selector_labels(backend.tm.metadata.name) | {CANARY_POD_LABEL: "true"}
    return backend.api.list("Pod", backend.namespace, ",".join(f"{k}={v}" for k, v in labels.items()))


def start_extra_pod(backend: KubernetesBackend, running: RuntimeConfig, candidate: RuntimeConfig) -> CanaryStart | None:
    """Create the canary Deployment (or find it), and say how its pod stands: rolling out until it is Ready, then
    its name; a failure (crash loop, never ready in the rollout timeout) deletes it. None when there is no room."""
    from slotune.backends.kube_canary import CanaryStart, openai_endpoint
    from slotune.backends.kube_deployment import pod_problem, pod_ready, rollout_state

    existing = canary_deployment(backend)
    wanted = candidate.with_changes(replicas=1)
    if existing is not None and config_from_annotation(existing) != wanted:
        delete_extra_pod(backend)  # a leftover of another canary
        existing = None
    if existing is None:
        if not room_for_one_more(backend, running):
            return None
        secret = backend._secret()
        backend._wrote()
        backend.api.apply(build_canary_deployment(backend, candidate, ((secret or {}).get("metadata") or {}).get(
            "uid", "")))
        backend._record("CanaryStarted", f"canary Deployment {canary_deployment_name(backend.tm.metadata.name)}: "
                        f"one extra pod of {candidate.describe()}", False)
        return CanaryStart("", ApplyResult.rolling_out("starting the canary pod"))
    pods = canary_pods(backend)
    problem = next((f"canary pod {p['metadata']['name']}: {found.message}" for p in pods
                    if (found := pod_problem(p)) is not None and not found.transient), None)
    if problem is None and backend._waited("canary-pod") > backend.settings.rollout_timeout_s:
        problem = f"canary pod not ready after {backend.settings.rollout_timeout_s:.0f} s"
    if problem is not None:
        backend._forget("canary-pod")
        delete_extra_pod(backend)
        backend._record("RolloutFailed", problem, True)
        return CanaryStart("", ApplyResult.failure(problem, crashed=True))
    ready = sorted((p for p in pods if pod_ready(p)), key=lambda p: p["metadata"]["name"])
    if not ready or not rollout_state(existing).done:
        return CanaryStart("", ApplyResult.rolling_out(f"canary pod: {rollout_state(existing).progress}"))
    serving = _serving(backend, ready[0], wanted)
    if serving is not None:
        return CanaryStart("", serving)
    backend._forget("canary-pod")
    return CanaryStart(ready[0]["metadata"]["name"], ApplyResult.success(changed=True),
                       openai_endpoint(backend, ready[0]))


def _serving(backend: KubernetesBackend, pod: dict[str, Any], wanted: RuntimeConfig) -> ApplyResult | None:
    """None once the canary pod's runtime answers `GET /admin/config` with the candidate (builtin engine: the pod
    is serving, and the pod-config invariant holds for it too); else how it stands. A Ready pod whose runtime does
    not answer yet would leave the canary's first window without its series, read as a canary pod replaced."""
    from slotune.backends.kube_deployment import runs

    if backend.tm.spec.runtime.engine is not Engine.BUILTIN:
        return None  # vLLM serves no /admin/config: its readiness probe is the only word
    live = backend._call_admin(pod, "GET", None, backend.admin_token())
    if live.status_code is None:
        return ApplyResult.rolling_out(f"waiting for the canary pod's /admin/config ({live.error})")
    if not (live.ok and live.live is not None and runs(live.live, wanted.admin_payload())):
        problem = f"canary pod {pod['metadata']['name']} does not run {wanted.describe()}: {live.live or live.error}"
        delete_extra_pod(backend)
        return ApplyResult.failure(problem, crashed=True)
    return None


def delete_extra_pod(backend: KubernetesBackend) -> bool:
    """Delete the canary Deployment, its ReplicaSet and pod with it; False when there was none."""
    path = object_path("Deployment", backend.namespace, canary_deployment_name(backend.tm.metadata.name))
    backend._wrote()
    response = backend.api.request("DELETE", path, body={"propagationPolicy": "Background"})
    if response.status_code == 404:
        return False
    if response.status_code >= 400:
        raise KubeError(response.status_code, response.text)
    backend._record("CanaryEnded", f"deleted the canary Deployment {canary_deployment_name(backend.tm.metadata.name)}",
                    False)
    return True

