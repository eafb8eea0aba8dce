"""Raw JSON access to the Kubernetes API server: the one client the operator's own code uses (kopf has its own).

Credentials come from a kubeconfig (KUBECONFIG, ~/.kube/config) or the pod's service account, through the
`kubernetes` package's loaders; requests go over httpx so manifests stay plain dicts end to end. Server-side apply
(`application/apply-patch+yaml`, field manager `slotune`) for objects slotune owns outright, create-once for the
admin Secret (409 = it exists), JSON merge patches for status and scaling.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from kubernetes import client, config
from prometheus_client import Counter, Histogram

FIELD_MANAGER = "slotune"
# By method and resource (subresource after a slash: "tunedmodels/status", "pods/proxy"): what each request is for
# tells a create's waste from its need (bench/bench_operator_scale.py, tests/integration/test_operator_requests.py).
API_REQUESTS = Counter("slotune_operator_api_requests", "Requests slotune's own code sent the API server",
                       ["method", "resource"])
# How long the API server took to answer (by method): what a tick waits for when it writes.
API_REQUEST_SECONDS = Histogram("slotune_operator_api_request_seconds", "How long one API request took", ["method"],
                                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0))

# kind -> (API path prefix, plural): the kinds slotune reads or writes.
_KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "Secret": ("/api/v1", "secrets"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors"),
    "TunedModel": ("/apis/slotune.io/v1alpha1", "tunedmodels"),
}


class KubeError(RuntimeError):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _KINDS[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


def manifest_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    return object_path(manifest["kind"], meta["namespace"], meta["name"])


def resource_of(path: str) -> str:
    """The resource a request path names: "deployments" of /apis/apps/v1/namespaces/a/deployments/b, with its
    subresource ("tunedmodels/status"); a group's discovery path names its group/version ("apps/v1")."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[3:] if parts[:1] == ["apis"] else parts[2:]  # after /apis/group/version or /api/v1
    if not rest:
        return "/".join(parts[1:3])
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    return f"{rest[0]}/{rest[2]}" if len(rest) > 2 else rest[0]


@dataclass(frozen=True)
class Credentials:
    host: str
    tls: ssl.SSLContext | bool  # CA and client certificate, or False where the kubeconfig skips verification
    configuration: client.Configuration

    def authorization(self) -> str | None:
        # Read per request: the in-cluster loader refreshes the projected service-account token.
        return self.configuration.get_api_key_with_prefix("BearerToken")


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return Credentials(configuration.host.rstrip("/"), _tls(configuration), configuration)


def _tls(configuration: client.Configuration) -> ssl.SSLContext | bool:
    if not configuration.verify_ssl and not configuration.cert_file:
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


class CachedKind(Protocol):
    """One kind's objects as a watch holds them (kube_cache.KindCache)."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def put(self, obj: dict[str, Any]) -> None: ...


class WatchedChildren(Protocol):
    """The watched children (kube_cache.ChildCache), declared here so the client does not import its cache."""

    def of(self, kind: str, namespace: str) -> CachedKind | None: ...


class KubeAPI:
    def __init__(self, credentials: Credentials, timeout_s: float = 10.0, max_connections: int = 10) -> None:
        """One client shared by the operator's worker threads (httpx's pool is thread-safe); `max_connections`
        bounds the requests in flight toward the API server."""
        self.credentials = credentials
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.Client(base_url=credentials.host, verify=credentials.tls, timeout=timeout_s, limits=limits)
        self._served: dict[tuple[str, str], tuple[bool, float]] = {}  # (group/version, plural) -> (served, when)
        self.children: WatchedChildren | None = None  # the watched children (kube_cache); None: every read is a GET

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object: from the watch cache when it holds the kind (synced), else a GET."""
        cache = self.children.of(kind, namespace) if self.children is not None else None
        if cache is not None:
            return cache.get(namespace, name)
        return self.get(object_path(kind, namespace, name))

    def _remember(self, written: dict[str, Any]) -> dict[str, Any]:
        """A write's answer goes into the watch cache, so the next read is never older than the write."""
        meta = written.get("metadata") or {}
        if self.children is not None and written.get("kind") and meta.get("name"):
            cache = self.children.of(written["kind"], meta.get("namespace", ""))
            if cache is not None:
                cache.put(written)
        return written

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, max_connections: int = 10) -> KubeAPI:
        return cls(load_credentials(kubeconfig), max_connections=max_connections)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
                content_type: str = "application/json", headers: dict[str, str] | None = None) -> httpx.Response:
        sent = {"Content-Type": content_type, "Accept": "application/json"} | (headers or {})
        if (authorization := self.credentials.authorization()) is not None:
            sent["Authorization"] = authorization
        API_REQUESTS.labels(method, resource_of(path)).inc()
        started = time.monotonic()
        try:
            return self._http.request(method, path, json=body, params=params, headers=sent)
        finally:
            API_REQUEST_SECONDS.labels(method).observe(time.monotonic() - started)

    def _checked(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            message = response.json().get("message", response.text) if _is_json(response) else response.text
            raise KubeError(response.status_code, message)
        return response.json() if response.content else {}

    def get(self, path: str) -> dict[str, Any] | None:
        response = self.request("GET", path)
        return None if response.status_code == 404 else self._checked(response)

    def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        response = self.request("GET", object_path(kind, namespace), params={"labelSelector": label_selector})
        return self._checked(response).get("items", [])

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply: slotune owns every field it sends and takes them back from anyone who changed them."""
        response = self.request("PATCH", manifest_path(manifest), body=manifest,
                                content_type="application/apply-patch+yaml",
                                params={"fieldManager": FIELD_MANAGER, "force": "true"})
        return self._remember(self._checked(response))

    def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create once: the object as created, or None when it already exists (409), which is not an error."""
        meta = manifest["metadata"]
        path = object_path(manifest["kind"], meta["namespace"])
        response = self.request("POST", path, body=manifest, params={"fieldManager": FIELD_MANAGER})
        if response.status_code == 409:
            return None
        return self._remember(self._checked(response))

    def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.request("PATCH", path, body=body, content_type="application/merge-patch+json")
        return self._remember(self._checked(response))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._checked(self.request("POST", path, body=body))

    def has_resource(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `group_version` (e.g. a CRD is installed). Asked once a
        minute at most: every deploy asks, and the answer changes only when someone installs a CRD."""
        key, now = (group_version, plural), time.monotonic()
        known = self._served.get(key)
        if known is not None and now - known[1] < 60.0:
            return known[0]
        response = self.request("GET", f"/apis/{group_version}")
        found = response.status_code != 404 and any(
            r.get("name") == plural for r in self._checked(response).get("resources", []))
        self._served[key] = (found, now)
        return found


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")
