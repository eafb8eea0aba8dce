"""Reading a Deployment's rollout and its pods as the Deployment controller and the kubelet report them: whether a
rollout is done (`kubectl rollout status` semantics), why a pod is not becoming ready (hopeless or transient), and
whether a pod's `/admin/config` answer shows a config. Pure functions of the objects read; the backends act on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_HOPELESS_WAITING = frozenset({"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                               "CreateContainerConfigError", "CreateContainerError"})


@dataclass(frozen=True)
class AdminCall:
    """One call to a pod's /admin/config, as recorded in events (never the token)."""

    pod: str
    status_code: int | None
    error: str = ""
    live: Mapping[str, Any] | None = None  # the config the pod answered with

    @property
    def ok(self) -> bool:
        return self.status_code == 200


@dataclass(frozen=True)
class Rollout:
    done: bool
    problem: str | None = None  # set when waiting longer will not help
    progress: str = ""
    blocked: str | None = None  # pods cannot be created now (a quota, an admission policy): may clear, may not


def runs(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a pod's answer from /admin/config shows every knob of `wanted` at its value (the runtime may answer
    with more fields than the operator sets, e.g. a speculative config's defaults)."""
    for key, value in wanted.items():
        have = live.get(key)
        if isinstance(value, Mapping) and isinstance(have, Mapping):
            if not runs(have, value):
                return False
        elif have != value:
            return False
    return True


def rollout_state(deployment: dict[str, Any]) -> Rollout:
    """`kubectl rollout status` semantics: the newest ReplicaSet has every replica updated and ready, no old ones."""
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    for condition in status.get("conditions", []):
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return Rollout(False, f"rollout stalled: {condition.get('message', '')}")
    if status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0):
        return Rollout(False, progress="the Deployment controller has not seen the change yet")
    wanted = spec.get("replicas", 1)
    done = (status.get("updatedReplicas", 0) >= wanted and status.get("replicas", 0) == wanted
            and status.get("readyReplicas", 0) >= wanted and status.get("availableReplicas", 0) >= wanted)
    progress = (f"{status.get('updatedReplicas', 0)}/{wanted} updated, {status.get('readyReplicas', 0)}/{wanted} "
                f"ready, {status.get('replicas', 0)} in all")
    return Rollout(done, progress=progress, blocked=None if done else _replica_failure(status))


def _replica_failure(status: dict[str, Any]) -> str | None:
    """The ReplicaSet controller's reason for not creating pods (FailedCreate: `exceeded quota`, a PodSecurity or
    LimitRange refusal), which the Deployment carries as its ReplicaFailure condition; no pod exists to say it."""
    for condition in status.get("conditions", []):
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            return f"pods cannot be created: {condition.get('message') or condition.get('reason', '')}"
    return None


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class PodProblem:
    message: str
    transient: bool  # may clear by itself (a pod waiting for a terminating one's GPUs)


def pod_problem_of(pods: list[dict[str, Any]], transient: bool) -> str | None:
    """The first pod's problem of the kind asked (transient or not), named by its pod."""
    for pod in pods:
        found = pod_problem(pod)
        if found is not None and found.transient == transient:
            return f"pod {pod['metadata']['name']}: {found.message}"
    return None


def pod_problem(pod: dict[str, Any]) -> PodProblem | None:
    """Why a pod is not becoming ready: crash loop, OOM kill, image pull (hopeless), unschedulable (transient)."""
    status = pod.get("status", {})
    for container in status.get("containerStatuses", []):
        waiting = container.get("state", {}).get("waiting") or {}
        if waiting.get("reason") in _HOPELESS_WAITING:
            return PodProblem(f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": "), transient=False)
        terminated = container.get("lastState", {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return PodProblem("OOMKilled", transient=False)
    for condition in status.get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return PodProblem(f"unschedulable: {condition.get('message', '')}", transient=True)
    return None
