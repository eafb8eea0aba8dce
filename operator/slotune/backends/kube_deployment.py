"""The Kubernetes backend of the tuning loop: run a RuntimeConfig as a TunedModel's Deployment and say how it went.

`deploy` applies the children (slotune.resources builds them). `apply` changes a config the cheapest way it can:
for the builtin engine with hotReconfigure and no restart-only knob changed, it scales the Deployment if the replica
count changed and POSTs `/admin/config` to every ready pod (bearer token from the admin Secret); otherwise it applies
a re-rendered Deployment and waits for the rollout. A rollout that crash-loops, cannot pull, cannot be scheduled or
does not finish in time is a failed apply (the loop rolls back and never tries that config again).

Pods whose config was changed live would come back with the Deployment's arguments after a restart, so `ready()`
re-sends the live config to every ready pod that has not received it yet (the runtime accepts a restated config).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from slotune.api import TunedModel
from slotune.backends.kube_api import KubeAPI, KubeError, object_path
from slotune.knobs import Engine, RuntimeConfig
from slotune.loop.protocols import ApplyResult
from slotune.resources import (
    RUNTIME_PORT,
    ChildNames,
    build_deployment,
    build_secret,
    build_service,
    build_service_monitor,
    config_from_annotation,
    selector_labels,
)
from slotune.settings import AdminTransport, OperatorSettings

log = logging.getLogger(__name__)

# Waiting reasons of a container that will not get better by waiting (kubelet's names).
_HOPELESS_WAITING = frozenset({"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                               "CreateContainerConfigError", "CreateContainerError"})
ADMIN_CONNECT_RETRY_S = 60.0  # how long a Ready pod may refuse connections before its POST counts as failed


class OperatorStopping(Exception):
    """The operator is shutting down mid-step. Nothing is saved, so the next operator redoes the step from the
    status (an unapplied change is applied again); it must never count as a failed config."""


@dataclass(frozen=True)
class Rollout:
    done: bool
    problem: str | None = None  # set when waiting longer will not help


@dataclass(frozen=True)
class AdminCall:
    """One POST /admin/config, as recorded in events (never the token)."""

    pod: str
    status_code: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code == 200


def new_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


class KubernetesBackend:
    def __init__(self, api: KubeAPI, tm: TunedModel, settings: OperatorSettings,
                 record: Callable[[str, str, bool], None] | None = None,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
        self.api = api
        self.tm = tm
        self.settings = settings
        self.names = ChildNames(tm.metadata.name)
        self.namespace = tm.metadata.namespace or "default"
        self._record = record or (lambda reason, message, warning: None)
        self._should_stop = should_stop
        self.live: RuntimeConfig | None = None  # the config the pods should run now
        self._synced: set[tuple[str, str]] = set()  # (pod uid, config key) that got the live config

    # --- children -------------------------------------------------------------------------------------------
    def deploy(self, config: RuntimeConfig) -> None:
        """Create or update every child for `config` (the admin Secret only once)."""
        if self.api.create(build_secret(self.tm, new_token())):
            self._record("SecretCreated", f"admin token Secret {self.names.secret} created", False)
        self.api.apply(build_service(self.tm))
        if self.api.has_resource("monitoring.coreos.com/v1", "servicemonitors"):
            self.api.apply(build_service_monitor(self.tm))
        self.api.apply(build_deployment(self.tm, config, self.settings))
        self.live = config

    def deployment(self) -> dict[str, Any] | None:
        return self.api.get(object_path("Deployment", self.namespace, self.names.deployment))

    def deployed_config(self) -> RuntimeConfig | None:
        """The config the Deployment's pod template was rendered from (annotation), None if not deployed."""
        found = self.deployment()
        return None if found is None else config_from_annotation(found)

    # --- the loop's Backend protocol -------------------------------------------------------------------------
    def apply(self, config: RuntimeConfig) -> ApplyResult:
        base = self.deployed_config()
        if base is not None and self._hot(base, config):
            return self._apply_hot(base, config)
        self.deploy(config)
        self._record("Restarting", f"rolling out {config.describe()}", False)
        return self._await_rollout()

    def ready(self) -> bool:
        deployment = self.deployment()
        if deployment is None or not rollout_state(deployment).done:
            return False
        base = config_from_annotation(deployment)
        if self.live is not None and base is not None and _differs_live(self.live, base):
            self._sync_pods(self.live, retry_s=0.0)  # pods (re)started from the template since; retried next tick
        return True

    # --- how ----------------------------------------------------------------------------------------------
    def _hot(self, base: RuntimeConfig, config: RuntimeConfig) -> bool:
        builtin = self.tm.spec.runtime.engine is Engine.BUILTIN
        return builtin and self.tm.spec.tuning.hot_reconfigure and not base.needs_restart(config)

    def _apply_hot(self, base: RuntimeConfig, config: RuntimeConfig) -> ApplyResult:
        if config.replicas != base.replicas:
            self.scale(base.with_changes(replicas=config.replicas))
        result = self._await_rollout()
        if not result.ok:
            return result
        running = self.live or base  # what the pods run now: unknown after a restart means the template's config
        self.live = config
        if not _differs_live(config, base) and not _differs_live(config, running):
            return ApplyResult.success()  # the pods started with exactly these knobs and still run them
        calls = self._sync_pods(config, retry_s=ADMIN_CONNECT_RETRY_S)
        failed = [c for c in calls if not c.ok]
        if failed:
            detail = "; ".join(f"{c.pod}: {c.status_code or c.error}" for c in failed)
            return ApplyResult.failure(f"POST /admin/config failed on {detail}", crashed=False)
        return ApplyResult.success()

    def scale(self, base: RuntimeConfig) -> None:
        """Change the replica count only (the pod template, hence the running pods, stay as they are)."""
        path = object_path("Deployment", self.namespace, self.names.deployment)
        annotation = json.dumps(base.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        self.api.merge_patch(path, {"metadata": {"annotations": {"slotune.io/config": annotation}},
                                    "spec": {"replicas": base.replicas}})
        self._record("Scaled", f"replicas -> {base.replicas}", False)

    def _await_rollout(self) -> ApplyResult:
        deadline = time.monotonic() + self.settings.rollout_timeout_s
        stuck_since: float | None = None  # when pods were first seen unschedulable, without a break
        while time.monotonic() < deadline and not self._should_stop():
            deployment = self.deployment()
            state = rollout_state(deployment) if deployment else Rollout(False, "Deployment vanished")
            if state.done:
                return ApplyResult.success()
            problem = state.problem or self._pod_problem(transient=False)
            unschedulable = None if problem else self._pod_problem(transient=True)
            stuck_since = (stuck_since or time.monotonic()) if unschedulable else None
            if unschedulable and time.monotonic() - (stuck_since or 0) > self.settings.unschedulable_grace_s:
                problem = unschedulable
            if problem:
                self._record("RolloutFailed", problem, True)
                return ApplyResult.failure(problem, crashed=True)
            time.sleep(1.0)
        if self._should_stop():
            raise OperatorStopping
        message = f"rollout not finished after {self.settings.rollout_timeout_s:.0f} s"
        self._record("RolloutFailed", message, True)
        return ApplyResult.failure(message, crashed=True)

    def _pod_problem(self, transient: bool) -> str | None:
        for pod in self.pods():
            found = pod_problem(pod)
            if found is not None and found.transient == transient:
                return f"pod {pod['metadata']['name']}: {found.message}"
        return None

    def pods(self) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in selector_labels(self.tm.metadata.name).items())
        return self.api.list("Pod", self.namespace, selector)

    def ready_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if pod_ready(p)]

    # --- hot reconfiguration --------------------------------------------------------------------------------
    def _sync_pods(self, config: RuntimeConfig, retry_s: float) -> list[AdminCall]:
        """POST the config to every ready pod that has not had it yet; returns the calls made."""
        calls = []
        token: str | None = None
        for pod in self.ready_pods():
            key = (pod["metadata"]["uid"], config.key())
            if key in self._synced:
                continue
            token = token or self.admin_token()
            call = self.post_admin_config(pod, config, token, retry_s)
            calls.append(call)
            if call.ok:
                self._synced.add(key)
        if calls and (retry_s > 0 or any(c.ok for c in calls)):  # a background retry that failed stays quiet
            ok = sum(c.ok for c in calls)
            self._record("Reconfigured", f"POST /admin/config {config.describe()} to {ok}/{len(calls)} pods "
                         f"({', '.join(c.pod for c in calls)})", ok < len(calls))
        return calls

    def admin_token(self) -> str:
        secret = self.api.get(object_path("Secret", self.namespace, self.names.secret))
        if secret is None or "token" not in secret.get("data", {}):
            raise KubeError(404, f"Secret {self.names.secret} has no key 'token'")
        return base64.b64decode(secret["data"]["token"]).decode()

    def post_admin_config(self, pod: dict[str, Any], config: RuntimeConfig, token: str, retry_s: float) -> AdminCall:
        """POST the hot knobs to one pod, retrying while it does not accept connections yet (a pod turns Ready a
        moment before its address is reachable from everywhere)."""
        name = pod["metadata"]["name"]
        # The API server's pod proxy drops Authorization after authenticating us; the runtime also reads this one.
        headers = {"Authorization": f"Bearer {token}", "X-Slotune-Admin-Token": token}
        deadline = time.monotonic() + retry_s
        while True:
            try:
                response = self._send_admin(pod, config.admin_payload(), headers)
            except (httpx.TransportError, _NoRoute) as error:
                if self._should_stop():
                    raise OperatorStopping from error
                if time.monotonic() > deadline:
                    return AdminCall(name, None, type(error).__name__)
                time.sleep(1.0)
                continue
            return AdminCall(name, response.status_code, "" if response.status_code == 200 else response.text[:200])

    def _send_admin(self, pod: dict[str, Any], payload: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        name = pod["metadata"]["name"]
        if self.settings.pod_endpoints_file is not None:
            url = self.settings.pod_endpoints().get(f"{self.namespace}/{name}")
            if url is None:
                raise _NoRoute(f"{name} is not in {self.settings.pod_endpoints_file}")
            return httpx.post(f"{url.rstrip('/')}/admin/config", json=payload, headers=headers, timeout=30)
        if self.settings.admin_transport is AdminTransport.PROXY:
            path = f"/api/v1/namespaces/{self.namespace}/pods/{name}:{RUNTIME_PORT}/proxy/admin/config"
            return self.api.request("POST", path, body=payload, headers=headers)
        url = f"http://{pod['status']['podIP']}:{RUNTIME_PORT}/admin/config"
        return httpx.post(url, json=payload, headers=headers, timeout=30)


def _differs_live(a: RuntimeConfig, b: RuntimeConfig) -> bool:
    """Whether two configs differ in a knob the runtime changes live."""
    return a.admin_payload() != b.admin_payload()


class _NoRoute(Exception):
    """The pod endpoints file does not list the pod (yet)."""


def rollout_state(deployment: dict[str, Any]) -> Rollout:
    """`kubectl rollout status` semantics: the newest ReplicaSet has every replica updated and ready, no old ones."""
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    for condition in status.get("conditions", []):
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return Rollout(False, f"rollout stalled: {condition.get('message', '')}")
    if status.get("observedGeneration", 0) < deployment["metadata"].get("generation", 0):
        return Rollout(False)
    wanted = spec.get("replicas", 1)
    done = (status.get("updatedReplicas", 0) >= wanted and status.get("replicas", 0) == wanted
            and status.get("readyReplicas", 0) >= wanted and status.get("availableReplicas", 0) >= wanted)
    return Rollout(done)


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class PodProblem:
    message: str
    transient: bool  # may clear by itself (a pod waiting for a terminating one's GPUs)


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
