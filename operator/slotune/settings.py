"""The operator's settings: one frozen object built from the environment and the `slotune operator` flags.

It sits in the bottom layer, beside the API types, because the builders below the controller
(`slotune.manifests.resources`, the Kubernetes backend) take it as an argument: the controller builds it once and passes
it down.

The environment variables are the operator <-> chart contract (charts/slotune/templates/deployment.yaml sets them);
a flag of the same name wins over its variable. Two settings exist for running the operator outside the cluster
network (tests, a laptop): `admin_transport` and `pod_endpoints_file`, both described below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class AdminTransport(StrEnum):
    """How the operator reaches a runtime pod's POST /admin/config."""

    DIRECT = "direct"  # http://POD_IP:8000, the normal in-cluster path
    PROXY = "proxy"  # the API server's pod proxy, for operators outside the pod network


# Pods of the TunedModel's namespace, and Prometheus pods (as the Prometheus Operator labels them) anywhere: the
# chart's networkPolicy.clients default, as helm's toJson writes it (keys sorted).
DEFAULT_NETWORK_POLICY_CLIENTS = ('[{"podSelector":{}},{"namespaceSelector":{},"podSelector":{"matchLabels":'
                                  '{"app.kubernetes.io/name":"prometheus"}}}]')


@dataclass(frozen=True)
class OperatorSettings:
    prometheus_url: str = ""
    """Prometheus base URL; empty: tuning pauses and MetricsAvailable=False with reason NoPrometheus."""
    runtime_image: str = "ghcr.io/slotune/runtime:0.1.0"
    """Image of the builtin runtime on GPUs (CUDA)."""
    runtime_image_cpu: str = "ghcr.io/slotune/runtime:0.1.0-cpu"
    """Image of the builtin runtime when spec.hardware.accelerator is cpu."""
    vllm_image: str = "vllm/vllm-openai:v0.11.0"
    """Image for spec.runtime.engine vllm."""
    allowed_builtin_images: tuple[str, ...] = ("ghcr.io/slotune/runtime",)
    """Runtime policy (slotune.manifests.admission): image repositories a TunedModel may name for the builtin engine."""
    allowed_vllm_images: tuple[str, ...] = ("vllm/vllm-openai",)
    """Runtime policy: image repositories a TunedModel may name for the vllm engine."""
    allow_extra_args: bool = True
    """Runtime policy: whether spec.runtime.extraArgs may be set (operator-owned flags are refused either way)."""
    allow_remote_code: bool = False
    """Runtime policy: whether --trust-remote-code may be passed in spec.runtime.extraArgs."""
    watch_namespaces: tuple[str, ...] = ()
    """Namespaces served; empty: all namespaces."""
    peering: str = "slotune"
    """kopf peering name; operator replicas sharing it elect one active replica."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    """kopf's liveness probe endpoint; empty: none (tests that run several operators on one host)."""
    metrics_port: int = 0
    """Port of the operator's own metrics (tick lag, ticks, API requests, PromQL queries); 0: not served."""
    admin_transport: AdminTransport = AdminTransport.DIRECT
    """How /admin/config is reached: direct (pod IP) or proxy (API server pod proxy)."""
    pod_endpoints_file: Path | None = None
    """JSON {"NAMESPACE/POD": "http://host:port"} read on every use; a pod listed there is reached at that URL.
    This exists for the end-to-end test harness, which stands in for the kubelet of kwok's fake nodes by running
    each pod's runtime as a local process; a real cluster never sets it."""
    tick_s: float = 2.0
    """How often a TunedModel's daemon looks again while something is in flight (a rollout, a retry); waiting for a
    window to end, it sleeps until the end instead."""
    workers: int = 16
    """Threads for blocking work (API server and Prometheus requests), shared by every TunedModel: the bound on
    concurrent requests the operator sends. Ticks wait on the API server's latency, not on CPU: at 1,000 TunedModels
    (a status write per TunedModel per window, ~0.5 s a request on the loaded 2-core machine) 8 were all busy and
    ticks queued up to 30 s."""
    rollout_timeout_s: float = 600.0
    """Longest wait for a Deployment rollout (image pull and model load) before a change counts as failed."""
    unschedulable_grace_s: float = 30.0
    """How long a new pod may stay unschedulable (waiting for GPUs a terminating pod still holds) before the
    rollout counts as failed."""
    fit_retry_s: float = 600.0
    """After a Deployment was scaled to the pods that fit (backends.kube_fit), how long until the requested count
    is asked for again; doubled after each retry that did not fit, up to fit_retry_max_s."""
    fit_retry_max_s: float = 3600.0
    """The longest wait between two retries of the requested count."""

    network_policy_clients: str = DEFAULT_NETWORK_POLICY_CLIENTS
    """JSON list of the NetworkPolicyPeers admitted to the runtime pods' serving port (the operator alone reaches the
    admin port); empty: the operator creates no NetworkPolicy (slotune.manifests.network_policy)."""

    def pod_endpoints(self) -> Mapping[str, str]:
        if self.pod_endpoints_file is None or not self.pod_endpoints_file.exists():
            return {}
        return json.loads(self.pod_endpoints_file.read_text() or "{}")


_ENV = {
    "prometheus_url": "SLOTUNE_PROMETHEUS_URL",
    "runtime_image": "SLOTUNE_RUNTIME_IMAGE",
    "runtime_image_cpu": "SLOTUNE_RUNTIME_IMAGE_CPU",
    "vllm_image": "SLOTUNE_VLLM_IMAGE",
    "allowed_builtin_images": "SLOTUNE_ALLOWED_BUILTIN_IMAGES",
    "allowed_vllm_images": "SLOTUNE_ALLOWED_VLLM_IMAGES",
    "allow_extra_args": "SLOTUNE_ALLOW_EXTRA_ARGS",
    "allow_remote_code": "SLOTUNE_ALLOW_REMOTE_CODE",
    "watch_namespaces": "SLOTUNE_WATCH_NAMESPACES",
    "peering": "SLOTUNE_PEERING",
    "log_level": "SLOTUNE_LOG_LEVEL",
    "liveness_endpoint": "SLOTUNE_LIVENESS_ENDPOINT",
    "metrics_port": "SLOTUNE_METRICS_PORT",
    "admin_transport": "SLOTUNE_ADMIN_TRANSPORT",
    "pod_endpoints_file": "SLOTUNE_POD_ENDPOINTS_FILE",
    "tick_s": "SLOTUNE_TICK_S",
    "workers": "SLOTUNE_WORKERS",
    "rollout_timeout_s": "SLOTUNE_ROLLOUT_TIMEOUT_S",
    "unschedulable_grace_s": "SLOTUNE_UNSCHEDULABLE_GRACE_S",
    "fit_retry_s": "SLOTUNE_FIT_RETRY_S",
    "fit_retry_max_s": "SLOTUNE_FIT_RETRY_MAX_S",
    "network_policy_clients": "SLOTUNE_NETWORK_POLICY_CLIENTS",
}


def env_names() -> Mapping[str, str]:
    """Setting name -> environment variable, for the CLI's help text."""
    return dict(_ENV)


def _convert(name: str, text: str) -> object:
    if name in {"watch_namespaces", "allowed_builtin_images", "allowed_vllm_images"}:
        return tuple(n.strip() for n in text.split(",") if n.strip())
    if name in {"allow_extra_args", "allow_remote_code"}:
        return _flag(name, text)
    if name == "admin_transport":
        return AdminTransport(text)
    if name == "pod_endpoints_file":
        return Path(text) if text else None
    if name in {"workers", "metrics_port"}:
        return int(text)
    if name in {"tick_s", "rollout_timeout_s", "unschedulable_grace_s", "fit_retry_s", "fit_retry_max_s"}:
        return float(text)
    return text


def _flag(name: str, text: str) -> bool:
    if text.strip().lower() not in {"true", "false"}:
        raise ValueError(f"{_ENV[name]} must be true or false, not {text!r}")
    return text.strip().lower() == "true"


def load_settings(overrides: Mapping[str, str | None] | None = None, environ: Mapping[str, str] | None = None
                  ) -> OperatorSettings:
    """Settings from `environ` (default os.environ), then `overrides` (flag values; None = not given)."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name, variable in _ENV.items():
        text = (overrides or {}).get(name)
        if text is None:
            text = environ.get(variable)
        if text is not None:
            values[name] = _convert(name, text)
    return _validated(OperatorSettings(**values))


def _validated(settings: OperatorSettings) -> OperatorSettings:
    if settings.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError(f"SLOTUNE_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, not {settings.log_level!r}")
    if settings.workers < 1:
        raise ValueError("SLOTUNE_WORKERS must be at least 1")
    if min(settings.tick_s, settings.rollout_timeout_s, settings.unschedulable_grace_s) <= 0:
        raise ValueError("SLOTUNE_TICK_S, SLOTUNE_ROLLOUT_TIMEOUT_S and SLOTUNE_UNSCHEDULABLE_GRACE_S must be positive")
    if not 0 < settings.fit_retry_s <= settings.fit_retry_max_s:
        raise ValueError("SLOTUNE_FIT_RETRY_S must be positive and at most SLOTUNE_FIT_RETRY_MAX_S")
    if settings.network_policy_clients and not isinstance(json.loads(settings.network_policy_clients), list):
        raise ValueError("SLOTUNE_NETWORK_POLICY_CLIENTS must be a JSON list of NetworkPolicyPeer objects or empty")
    return settings

