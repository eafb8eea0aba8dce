"""The Kubernetes backend of the tuning loop: run a RuntimeConfig as a TunedModel's Deployment and say how it went.

`deploy` applies the children (slotune.manifests.resources builds them). `apply` changes a config the cheapest way it
can:
for the builtin engine with hotReconfigure and no restart-only knob changed, it scales the Deployment if the replica
count changed and POSTs `/admin/config` to the ready pods; otherwise it applies a re-rendered Deployment. It never
waits: while the rollout is on its way it answers `rolling_out`, and the loop asks again on a later tick. A rollout
that crash-loops, cannot pull, stays unschedulable or uncreatable (a quota) past its grace or does not finish in time
is a failed apply (the loop rolls back and never tries that config again).

The invariant the status relies on: every ready pod runs the config the status says it runs (the running config, or
during a canary the candidate on the canary pod: backends.kube_canary). `apply` reads each ready
pod's live config back (`GET /admin/config`) and re-sends it where it differs: a pod restarted from the template
after a live change, a new generation whose starting config matches the template while the pods kept other knobs,
a rollback to a config sent before. Nothing is remembered about what was sent; only the pod's answer counts.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx

from slotune.api import TunedModel
from slotune.backends import kube_fit
from slotune.backends.child_fields import tunedmodel_fields
from slotune.backends.kube_api import KubeAPI, KubeError, object_path
from slotune.backends.kube_canary import CanaryAssignment, end_canary, end_stale_canary, start_canary
from slotune.backends.kube_canary_pod import CANARY_POD_LABEL
from slotune.backends.kube_canary_start import CanaryStart
from slotune.backends.kube_pods import AdminCall, Rollout, pod_problem_of, pod_ready, rollout_state, runs
from slotune.knobs import Engine, RuntimeConfig
from slotune.loop.protocols import ApplyResult, ReplicaCounts
from slotune.manifests import admission
from slotune.manifests.network_policy import build_network_policy, operator_namespace, parse_peers
from slotune.manifests.resources import (
    ADMIN_PORT,
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
T = TypeVar("T")

# Waiting reasons of a container that will not get better by waiting (kubelet's names).
ADMIN_CONNECT_RETRY_S = 60.0  # how long a Ready pod may refuse connections before the apply counts as failed
ADMIN_TIMEOUT_S = 10.0


class ChildRefused(Exception):
    """The API server refused a child object (422 Invalid, 400): the spec cannot be deployed as written."""

    reason = "ChildRefused"

    def __init__(self, kind: str, error: KubeError) -> None:
        fields = tunedmodel_fields(str(error))  # what the author wrote, not the Deployment's path
        source = f" (from the TunedModel's {', '.join(fields)})" if fields else ""
        super().__init__(f"the API server refused the {kind}{source}: {error}")
        self.kind = kind


def _unconvertible(error: KubeError) -> bool:
    """Server-side apply answers 500, not 400, when the applied object cannot be converted to its typed form (a
    quantity such as `cpu: lots`): that is the object's fault and retrying gets the same answer."""
    return error.status_code == 500 and "failed to convert new object" in str(error)


class PolicyRefused(ChildRefused):
    """The cluster admin's runtime policy (slotune.manifests.admission) refuses the spec; no child was created."""

    reason = "PolicyRefused"

    def __init__(self, message: str) -> None:
        Exception.__init__(self, f"{admission.REFUSED}: {message}")
        self.kind = "TunedModel"


def new_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


class KubernetesBackend:
    def __init__(self, api: KubeAPI, tm: TunedModel, settings: OperatorSettings,
                 record: Callable[[str, str, bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.api = api
        self.tm = tm
        self.settings = settings
        self.names = ChildNames(tm.metadata.name)
        self.namespace = tm.metadata.namespace or "default"
        self._record = record or (lambda reason, message, warning: None)
        self._clock = clock
        self._wall = wall  # the fit retry's time outlives this process: wall clock, on the Deployment (kube_fit)
        self._waiting_since: dict[str, float] = {}  # what -> when first seen not there yet (rollout, pod address)
        self._seen: dict[str, dict[str, Any] | None] | None = None  # the Deployment as read in this look (one_look)

    @contextmanager
    def one_look(self) -> Iterator[None]:
        """Within one tick the Deployment is read once: the step, the status' health and the Ready refresh all ask
        for it, three GETs a tick that a thousand TunedModels pay every window. A write through this backend (deploy,
        scale) reads it again."""
        self._seen = {}
        try:
            yield
        finally:
            self._seen = None

    def _wrote(self) -> None:
        if self._seen is not None:
            self._seen.clear()

    # --- children -------------------------------------------------------------------------------------------
    def deploy(self, config: RuntimeConfig) -> None:
        """Create or update every child for `config` (the admin Secret only once). Raises ChildRefused when the
        API server rejects one, PolicyRefused (before creating anything) when the runtime policy refuses the spec:
        waiting will not make either valid."""
        if (refused := admission.refusal(self.tm.spec, admission.RuntimePolicy.of(self.settings))) is not None:
            raise PolicyRefused(refused)
        self._wrote()
        # The Deployment right after the Secret whose uid it names: on a busy API server every request before it
        # is create-to-Deployment latency. A new Secret comes back from the create; an existing one is read.
        secret = self._child("Secret", lambda: self.api.create(build_secret(self.tm, new_token()))) or self._secret()
        token_uid = ((secret or {}).get("metadata") or {}).get("uid", "")
        manifest = build_deployment(self.tm, config, self.settings, token_uid)
        manifest["spec"]["replicas"] = kube_fit.fitted_replicas(  # never queue again pods that did not fit
            self.deployment(), config.replicas, self.tm.metadata.generation or 1)
        manifest["metadata"].setdefault("annotations", {})[kube_fit.REQUESTED_ANNOTATION] = str(config.replicas)
        self._child("Deployment", lambda: self.api.apply(manifest))
        self._child("Service", lambda: self.api.apply(build_service(self.tm)))
        if self.settings.network_policy_clients:  # deny by default: the admin port from the operator alone
            self._child("NetworkPolicy", lambda: self.api.apply(build_network_policy(
                self.tm, parse_peers(self.settings.network_policy_clients), operator_namespace())))
        if self.api.has_resource("monitoring.coreos.com/v1", "servicemonitors"):
            self._child("ServiceMonitor", lambda: self.api.apply(build_service_monitor(self.tm)))
        if (self.tm.metadata.generation or 1) > 1:  # a new generation's loop knows nothing of an old canary
            end_stale_canary(self)

    def _secret(self) -> dict[str, Any] | None:
        return self.api.read("Secret", self.namespace, self.names.secret)

    def rotate_deleted_token(self) -> bool:
        """A deleted admin token Secret is replaced by a new token, and the pods restart to read it (the pod
        template names the Secret's uid). True when it rotated; never a word of the token itself."""
        if self._secret() is not None:
            return False
        config = self.deployed_config()
        if config is None:
            return False  # nothing deployed yet: the first deploy creates the Secret
        self.deploy(config)
        self._record("AdminTokenRotated", "the admin token Secret was deleted: a new token, the pods restart to "
                     "read it", False)
        return True

    def _child(self, kind: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except KubeError as error:
            if error.status_code in (400, 422) or _unconvertible(error):
                raise ChildRefused(kind, error) from error
            raise

    def deployment(self) -> dict[str, Any] | None:
        if self._seen is not None and "deployment" in self._seen:
            return self._seen["deployment"]
        found = self.api.read("Deployment", self.namespace, self.names.deployment)
        if self._seen is not None:
            self._seen["deployment"] = found
        return found

    def deployed_config(self) -> RuntimeConfig | None:
        """The config the Deployment's pod template was rendered from (annotation), None if not deployed."""
        found = self.deployment()
        return None if found is None else config_from_annotation(found)

    # --- the loop's Backend protocol -------------------------------------------------------------------------
    def apply(self, config: RuntimeConfig) -> ApplyResult:
        deployment = self.deployment()
        base = None if deployment is None else config_from_annotation(deployment)
        changed = False
        if base is None or not self._hot(base, config):
            if base != config:
                try:
                    self.deploy(config)
                except ChildRefused as error:
                    self._record(error.reason, str(error), True)
                    return ApplyResult.failure(str(error), crashed=True)
                if base is not None:
                    self._record("Restarting", f"rolling out {config.describe()}", False)
                changed, deployment = True, self.deployment()
        elif config.replicas != base.replicas:
            self.scale(base.with_changes(replicas=config.replicas))
            changed, deployment = True, self.deployment()
        rollout = self._rollout(deployment, config)
        if rollout is not None:
            return rollout
        if not self._hot_capable():
            return ApplyResult.success(changed=changed)  # pods run the template's arguments, nothing else
        return self._sync_pods(config, changed)

    def ready(self) -> bool:
        deployment = self.deployment()
        return deployment is not None and rollout_state(deployment).done

    def replica_counts(self) -> ReplicaCounts:
        """Replicas serving (ready) and ordered but not yet ready, from the Deployment's status: capacity control
        learns a pod's start-up from them and judges no window half-served by a pod still starting."""
        deployment = self.deployment()
        if deployment is None:
            return ReplicaCounts(ready=0, starting=0)
        wanted = deployment.get("spec", {}).get("replicas", 1)
        ready = min(deployment.get("status", {}).get("readyReplicas", 0), wanted)
        return ReplicaCounts(ready=ready, starting=wanted - ready)

    def start_canary(self, running: RuntimeConfig, candidate: RuntimeConfig) -> CanaryStart | None:
        return start_canary(self, running, candidate)

    def end_canary(self) -> None:
        end_canary(self)

    # --- how ----------------------------------------------------------------------------------------------
    def _hot_capable(self) -> bool:
        return self.tm.spec.runtime.engine is Engine.BUILTIN and self.tm.spec.tuning.hot_reconfigure

    def _hot(self, base: RuntimeConfig, config: RuntimeConfig) -> bool:
        return self._hot_capable() and not base.needs_restart(config)

    def scale(self, base: RuntimeConfig) -> None:
        """Change the replica count only (the pod template, hence the running pods, stay as they are)."""
        self._wrote()
        path = object_path("Deployment", self.namespace, self.names.deployment)
        annotation = json.dumps(base.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        self.api.merge_patch(path, {"metadata": {"annotations": {"slotune.io/config": annotation,
                                                                 kube_fit.REQUESTED_ANNOTATION: str(base.replicas)}},
                                    "spec": {"replicas": base.replicas}})
        self._record("Scaled", f"replicas -> {base.replicas}", False)

    def _rollout(self, deployment: dict[str, Any] | None, config: RuntimeConfig) -> ApplyResult | None:
        """None when the rollout is done; otherwise how it stands, without waiting for it."""
        state = rollout_state(deployment) if deployment else Rollout(False, "Deployment vanished")
        key = f"rollout:{config.key()}"
        if state.done:
            self._forget("rollout:", "unschedulable")
            if (reset := kube_fit.reset_patch(deployment)) is not None:  # the full count runs: backoff from the start
                self._patch_deployment(reset)
            return None
        pods = None if state.problem else self.pods()  # one list per look, for both kinds of problem
        problem = state.problem or pod_problem_of(pods or [], transient=False)
        unschedulable = None if problem else state.blocked or pod_problem_of(pods or [], transient=True)
        if unschedulable is None:
            self._waiting_since.pop("unschedulable", None)
        elif self._waited("unschedulable") > self.settings.unschedulable_grace_s:
            problem = unschedulable
        if problem is None and self._waited(key) > self.settings.rollout_timeout_s:
            problem = f"rollout not finished after {self.settings.rollout_timeout_s:.0f} s"
        if problem is not None and problem is unschedulable and deployment is not None:
            problem = self._scale_to_fit(config, deployment, pods if pods is not None else self.pods(), problem)
        if problem is not None:
            self._forget("rollout:", "unschedulable")
            self._record("RolloutFailed", problem, True)
            return ApplyResult.failure(problem, crashed=True)
        return ApplyResult.rolling_out(unschedulable or state.progress or "rollout in progress")

    def _scale_to_fit(self, config: RuntimeConfig, deployment: dict[str, Any], pods: list[dict[str, Any]],
                      problem: str) -> str:
        """Pods still unschedulable (or uncreatable) past their grace: scale to the pods placed (kube_fit)."""
        result = kube_fit.fit(config.replicas, pods, problem, deployment, kube_fit.FitBackoff.of(self.settings),
                              self._wall())
        self._patch_deployment(kube_fit.fit_patch(result, self.tm.metadata.generation or 1))
        self._record("ScaledToFit", result.message(), True)
        return result.message()

    def retry_fit(self, config: RuntimeConfig) -> str | None:
        """Where `config`'s replicas were scaled to what fits and the retry is due, ask for all of them again (the
        rollout then fits again past the grace, or runs them); what was done, else None."""
        deployment = self.deployment()
        patch = kube_fit.retry_patch(deployment, config.replicas, self._wall())
        if patch is None:
            return None
        fitted = (deployment or {}).get("spec", {}).get("replicas", 0)
        self._patch_deployment(patch)
        return (f"asking for the {config.replicas} requested replicas again (retry "
                f"{patch['metadata']['annotations'][kube_fit.RETRIES_ANNOTATION]}; {fitted} fitted)")

    def _patch_deployment(self, patch: dict[str, Any]) -> None:
        self._wrote()
        self.api.merge_patch(object_path("Deployment", self.namespace, self.names.deployment), patch)

    def _waited(self, what: str) -> float:
        """Seconds since `what` was first seen pending, on this operator (a restart starts the clock again)."""
        return self._clock() - self._waiting_since.setdefault(what, self._clock())

    def _forget(self, *prefixes: str) -> None:
        for key in [k for k in self._waiting_since if k.startswith(prefixes)]:
            del self._waiting_since[key]

    def pods(self) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in selector_labels(self.tm.metadata.name).items())
        return self.api.list("Pod", self.namespace, f"{selector},!{CANARY_POD_LABEL}")  # never the extra canary pod

    def ready_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if pod_ready(p)]

    # --- the invariant: read back, re-send where it differs ----------------------------------------------------
    def _sync_pods(self, config: RuntimeConfig, changed: bool) -> ApplyResult:
        canary = CanaryAssignment.of(self.deployment())  # the canary pod runs its own config (kube_canary)
        token = self.admin_token()
        unreachable, refused, sent = [], [], []
        for pod in self.ready_pods():
            name = pod["metadata"]["name"]
            wanted = (canary.config if canary is not None and canary.pod == name else config).admin_payload()
            live = self._call_admin(pod, "GET", None, token)
            if live.ok and live.live is not None and runs(live.live, wanted):
                self._waiting_since.pop(f"admin:{name}", None)
                continue
            if live.status_code is None:
                unreachable.append(name)
                continue
            posted = self._call_admin(pod, "POST", wanted, token)
            if posted.ok and posted.live is not None and runs(posted.live, wanted):
                sent.append(f"{name} (canary: {canary.config.describe()})" if canary and canary.pod == name else name)
            else:
                refused.append(f"{name}: {posted.status_code or ''} {posted.error}".strip())
        if sent:
            self._record("Reconfigured", f"POST /admin/config {config.describe()} to {', '.join(sent)}", False)
        if refused:
            detail = "; ".join(refused)
            self._record("ReconfigureFailed", f"{config.describe()}: {detail}", True)
            return ApplyResult.failure(f"POST /admin/config failed on {detail}", crashed=False)
        if unreachable:
            return self._unreachable(unreachable)
        return ApplyResult.success(changed=changed or bool(sent))

    def _unreachable(self, pods: list[str]) -> ApplyResult:
        """A pod turns Ready a moment before its address answers from everywhere: wait a while, then give up."""
        waited = max(self._waited(f"admin:{name}") for name in pods)
        if waited > ADMIN_CONNECT_RETRY_S:
            return ApplyResult.failure(f"/admin/config unreachable for {waited:.0f} s on {', '.join(pods)}",
                                       crashed=False)
        return ApplyResult.rolling_out(f"waiting for /admin/config on {', '.join(pods)}")

    def admin_token(self) -> str:
        secret = self._secret()
        if secret is None or "token" not in secret.get("data", {}):
            raise KubeError(404, f"Secret {self.names.secret} has no key 'token'")
        return base64.b64decode(secret["data"]["token"]).decode()

    def _call_admin(self, pod: dict[str, Any], method: str, payload: dict[str, Any] | None, token: str) -> AdminCall:
        name = pod["metadata"]["name"]
        # The API server's pod proxy drops Authorization after authenticating us; the runtime also reads this one.
        headers = {"Authorization": f"Bearer {token}", "X-Slotune-Admin-Token": token}
        try:
            response = self._send_admin(pod, method, payload, headers)
        except (httpx.TransportError, _NoRoute) as error:
            return AdminCall(name, None, type(error).__name__)
        if response.status_code != 200:
            return AdminCall(name, response.status_code, response.text[:200])
        try:
            return AdminCall(name, 200, live=response.json())
        except ValueError:
            return AdminCall(name, 200, "answer is not JSON")

    def _send_admin(self, pod: dict[str, Any], method: str, payload: dict[str, Any] | None,
                    headers: dict[str, str]) -> httpx.Response:
        name = pod["metadata"]["name"]
        if self.settings.pod_endpoints_file is not None:
            url = self.settings.pod_endpoints().get(f"{self.namespace}/{name}")
            if url is None:
                raise _NoRoute(f"{name} is not in {self.settings.pod_endpoints_file}")
            return httpx.request(method, f"{url.rstrip('/')}/admin/config", json=payload, headers=headers,
                                 timeout=ADMIN_TIMEOUT_S)
        if self.settings.admin_transport is AdminTransport.PROXY:
            path = f"/api/v1/namespaces/{self.namespace}/pods/{name}:{ADMIN_PORT}/proxy/admin/config"
            return self.api.request(method, path, body=payload, headers=headers)
        url = f"http://{pod['status']['podIP']}:{ADMIN_PORT}/admin/config"
        return httpx.request(method, url, json=payload, headers=headers, timeout=ADMIN_TIMEOUT_S)


class _NoRoute(Exception):
    """The pod endpoints file does not list the pod (yet)."""
