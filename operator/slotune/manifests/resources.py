"""The Kubernetes objects one TunedModel owns, as pure builders: typed TunedModel + RuntimeConfig in, manifest out.

Nothing here talks to the API server (slotune.backends.kube_deployment applies what these return). Children follow the
operator <-> chart contract: Deployment and Service `NAME-runtime`, Secret `NAME-admin-token` (key `token`, mounted
at /var/run/slotune/admin-token), ServiceMonitor `NAME-runtime`; all labelled for the TunedModel and owned by it.
Engine flags come from `RuntimeConfig.engine_args()`, so the builtin runtime and vLLM get one knob vocabulary
(docs/facts.md#flags). A draft model (`spec.model.draftModel`, carried into the config by the tuner) is a source
like the model's: it is rendered as the path the engine reads and its PVC is mounted, as the model's is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slotune.api import API_VERSION, KIND, Accelerator, TunedModel
from slotune.knobs import Engine, RuntimeConfig
from slotune.settings import OperatorSettings
from slotune.slo import SLOSpec

RUNTIME_PORT = 8000
ADMIN_PORT = 8001  # the builtin runtime's /admin/config alone (--admin-port), so a NetworkPolicy can fence it apart
ADMIN_TOKEN_DIR = "/var/run/slotune"
ADMIN_TOKEN_FILE = f"{ADMIN_TOKEN_DIR}/admin-token"
CACHE_DIR = "/var/cache/slotune"
CONFIG_ANNOTATION = "slotune.io/config"  # the RuntimeConfig the pod template was rendered from (JSON)
# On the pod template: the uid of the admin token Secret the pods read at start. A deleted Secret is recreated with a
# new token (a new uid), so the template changes and the pods restart with the new token: that is the rotation.
TOKEN_SECRET_ANNOTATION = "slotune.io/admin-token-secret-uid"
TUNEDMODEL_LABEL = "slotune.io/tunedmodel"
RUNTIME_UID = 10001  # the runtime images' non-root user (deploy/Dockerfile.runtime)

# Pod Security Standards "restricted" for the container (the pod repeats the user and the seccomp profile): non-root,
# no privilege escalation, no capabilities, seccomp RuntimeDefault, and a read-only root filesystem, so every path the
# runtime writes is a volume (_volumes). tests/integration/test_runtime_pod_security.py runs the pods in a namespace
# that enforces the profile.
def restricted_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}

# GPU feature discovery's nvidia.com/gpu.product values (what kube nodes carrying these GPUs are labelled with).
GPU_PRODUCTS: dict[Accelerator, str] = {
    Accelerator.NVIDIA_H200: "NVIDIA-H200",
    Accelerator.NVIDIA_H100_80GB: "NVIDIA-H100-80GB-HBM3",
    Accelerator.NVIDIA_H100_PCIE: "NVIDIA-H100-PCIe",
    Accelerator.NVIDIA_A100_80GB: "NVIDIA-A100-SXM4-80GB",
    Accelerator.NVIDIA_A100_40GB: "NVIDIA-A100-SXM4-40GB",
    Accelerator.NVIDIA_L4: "NVIDIA-L4",
}


@dataclass(frozen=True)
class ChildNames:
    """Names of the objects a TunedModel named `name` owns."""

    name: str

    @property
    def deployment(self) -> str:
        return f"{self.name}-runtime"

    @property
    def service(self) -> str:
        return f"{self.name}-runtime"

    @property
    def service_monitor(self) -> str:
        return f"{self.name}-runtime"

    @property
    def secret(self) -> str:
        return f"{self.name}-admin-token"


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "slotune-runtime", "app.kubernetes.io/instance": name}


def labels(name: str) -> dict[str, str]:
    return selector_labels(name) | {"app.kubernetes.io/managed-by": "slotune", TUNEDMODEL_LABEL: name}


def owner_reference(tm: TunedModel) -> dict[str, Any]:
    uid = (tm.metadata.model_extra or {}).get("uid")
    if not uid:
        raise ValueError(f"TunedModel {tm.metadata.name} has no metadata.uid: read it from the API server first")
    return {"apiVersion": API_VERSION, "kind": KIND, "name": tm.metadata.name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def _metadata(tm: TunedModel, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": tm.metadata.namespace, "labels": labels(tm.metadata.name),
                            "ownerReferences": [owner_reference(tm)]}
    if annotations:
        meta["annotations"] = annotations
    return meta


def config_annotation(config: RuntimeConfig) -> str:
    return json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def config_from_annotation(deployment: dict[str, Any]) -> RuntimeConfig | None:
    text = (deployment.get("metadata", {}).get("annotations") or {}).get(CONFIG_ANNOTATION)
    return None if text is None else RuntimeConfig.model_validate(json.loads(text))


def image(tm: TunedModel, settings: OperatorSettings) -> str:
    if tm.spec.runtime.image:
        return tm.spec.runtime.image
    if tm.spec.runtime.engine is Engine.VLLM:
        return settings.vllm_image
    cpu = tm.spec.hardware.accelerator is Accelerator.CPU
    return settings.runtime_image_cpu if cpu else settings.runtime_image


def model_argument(source: str) -> str:
    """What the engine's model argument is for a spec.model.source (pvc:// sources are mounted under /models)."""
    if source.startswith("hf://"):
        return source.removeprefix("hf://")
    if source.startswith("pvc://"):
        return "/models/" + source.removeprefix("pvc://")
    return source.removeprefix("file://")


def _pvc_claim(source: str) -> str | None:
    return source.removeprefix("pvc://").split("/", 1)[0] if source.startswith("pvc://") else None


def _draft_source(config: RuntimeConfig) -> str | None:
    return None if config.speculative is None else config.speculative.draft_model


def _engine_config(config: RuntimeConfig) -> RuntimeConfig:
    """`config` with its draft model's source (hf://, pvc://, file://) replaced by the path the engine reads."""
    draft = _draft_source(config)
    if config.speculative is None or draft is None:
        return config
    return config.with_changes(speculative=config.speculative.model_copy(update={"draft_model": model_argument(draft)}))


def engine_args(tm: TunedModel, config: RuntimeConfig) -> list[str]:
    """The runtime container's arguments: the model, the serving port, the knobs, then spec.runtime.extraArgs."""
    spec = tm.spec
    common = ["--served-model-name", spec.model.name, "--host", "0.0.0.0", "--port", str(RUNTIME_PORT)]
    if spec.model.dtype.value != "auto":
        common += ["--dtype", spec.model.dtype.value]
    if spec.model.max_model_len is not None:
        common += ["--max-model-len", str(spec.model.max_model_len)]
    model = model_argument(spec.model.source)
    if spec.runtime.engine is Engine.VLLM:
        args = [model, *common]
        if spec.hardware.count > 1:
            args += ["--tensor-parallel-size", str(spec.hardware.count)]
        if spec.model.revision:
            args.append(f"--revision={spec.model.revision}")  # =: a revision is a value, never a flag
        return [*args, *_engine_config(config).engine_args(), *spec.runtime.extra_args]
    args = ["--model", model, *common, "--admin-port", str(ADMIN_PORT), "--admin-token-file", ADMIN_TOKEN_FILE]
    if spec.hardware.accelerator is Accelerator.CPU:
        args += ["--device", "cpu"]
    if edges := slo_bucket_edges(spec.slo):
        args.append(f"--slo-bucket-edges={edges}")
    return [*args, *_engine_config(config).engine_args(), *spec.runtime.extra_args]


def slo_bucket_edges(slo: SLOSpec) -> str:
    """The builtin runtime's extra histogram edges at every latency target (seconds), so the share of requests
    within a target is a bucket count, not an interpolation inside one of vLLM's wide buckets."""
    edges = dict.fromkeys(f"{t.metric.value}={t.target_ms / 1000:g}" for t in slo.targets())
    return ",".join(edges)


def _container_ports(tm: TunedModel) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": RUNTIME_PORT, "protocol": "TCP"}]
    if tm.spec.runtime.engine is Engine.BUILTIN:
        ports.append({"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"})
    return ports


def _command(tm: TunedModel) -> list[str]:
    if tm.spec.runtime.engine is Engine.VLLM:
        return ["vllm", "serve"]
    return ["python", "-m", "gpu_runtime", "serve"]


def resources(tm: TunedModel) -> dict[str, dict[str, str]]:
    """Container requests/limits: spec.runtime.resources plus hardware.count GPUs (limits = requests for GPUs)."""
    spec_resources = tm.spec.runtime.resources
    requests = {k: str(v) for k, v in (spec_resources.requests if spec_resources else {}).items()}
    limits = {k: str(v) for k, v in (spec_resources.limits if spec_resources else {}).items()}
    if tm.spec.hardware.accelerator is not Accelerator.CPU and tm.spec.hardware.count > 0:
        gpus = str(tm.spec.hardware.count)
        limits["nvidia.com/gpu"] = gpus
        requests["nvidia.com/gpu"] = gpus
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def node_selector(tm: TunedModel) -> dict[str, str]:
    """GPU feature discovery's product label for the accelerator, overridden by spec.hardware.nodeSelector."""
    product = GPU_PRODUCTS.get(tm.spec.hardware.accelerator)
    chosen = {"nvidia.com/gpu.product": product} if product else {}
    return chosen | dict(tm.spec.hardware.node_selector)


def tolerations(tm: TunedModel) -> list[dict[str, Any]]:
    declared = [t.model_dump(by_alias=True, exclude_none=True) for t in tm.spec.hardware.tolerations]
    if tm.spec.hardware.accelerator is Accelerator.CPU:
        return declared
    # GPU node pools are commonly tainted nvidia.com/gpu:NoSchedule (GKE, EKS, the GPU operator's docs).
    return [*declared, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period_s, "timeoutSeconds": 5,
            "failureThreshold": failures}


def _volumes(tm: TunedModel, config: RuntimeConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): scratch /tmp and a model cache (the root filesystem is read-only), the admin token,
    shared memory for vLLM's workers, and the PVC of the model and of the draft model where either is pvc://."""
    names = ChildNames(tm.metadata.name)
    token_items = [{"key": "token", "path": "admin-token"}]
    volumes = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "admin-token", "secret": {"secretName": names.secret, "items": token_items, "defaultMode": 0o440}},
    ]
    mounts = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
    ]
    if tm.spec.runtime.engine is Engine.VLLM:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    sources = (tm.spec.model.source, _draft_source(config) or "")
    claims = dict.fromkeys(c for c in map(_pvc_claim, sources) if c is not None)  # ordered, one volume per claim
    for index, claim in enumerate(claims):
        name = "model" if index == 0 else f"model-{index}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"/models/{claim}", "readOnly": True})
    return volumes, mounts


def _container(tm: TunedModel, config: RuntimeConfig, settings: OperatorSettings) -> dict[str, Any]:
    _, mounts = _volumes(tm, config)
    env = [
        {"name": "SLOTUNE_MODEL_CACHE", "value": f"{CACHE_DIR}/models"},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HOME", "value": "/tmp"},  # the image's user has no home; tools write ~/.cache and ~/.config
    ]
    container: dict[str, Any] = {
        "name": "runtime", "image": image(tm, settings), "command": _command(tm), "args": engine_args(tm, config),
        "ports": _container_ports(tm), "env": env,
        "startupProbe": _probe(period_s=5, failures=120),  # model load and first compile: up to 10 minutes
        "readinessProbe": _probe(period_s=5, failures=2),
        "livenessProbe": _probe(period_s=10, failures=3),
        "securityContext": restricted_security_context(),
        "volumeMounts": mounts,
    }
    if found := resources(tm):
        container["resources"] = found
    return container


def build_deployment(tm: TunedModel, config: RuntimeConfig, settings: OperatorSettings,
                     token_secret_uid: str = "") -> dict[str, Any]:
    """The runtime Deployment running `config` (its replicas and its per-process knobs), its pods reading the token
    of the admin Secret whose uid is `token_secret_uid`."""
    name = tm.metadata.name
    volumes, _ = _volumes(tm, config)
    pod_spec: dict[str, Any] = {
        "containers": [_container(tm, config, settings)],
        "volumes": volumes,
        "automountServiceAccountToken": False,  # the runtime never calls the API server
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID,
                            "fsGroup": RUNTIME_UID, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if selector := node_selector(tm):
        pod_spec["nodeSelector"] = selector
    if found := tolerations(tm):
        pod_spec["tolerations"] = found
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(tm, ChildNames(name).deployment, {CONFIG_ANNOTATION: config_annotation(config)}),
        "spec": {
            "replicas": config.replicas,
            "strategy": _strategy(tm),
            "selector": {"matchLabels": selector_labels(name)},
            "template": {"metadata": _template_metadata(name, token_secret_uid), "spec": pod_spec},
        },
    }


def _template_metadata(name: str, token_secret_uid: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": labels(name)}
    if token_secret_uid:
        meta["annotations"] = {TOKEN_SECRET_ANNOTATION: token_secret_uid}
    return meta


def _strategy(tm: TunedModel) -> dict[str, Any]:
    """Replace GPU pods one at a time without a surge pod: a surge pod would need a second set of GPUs, which a
    full node does not have, and the rollout would wait forever. CPU pods surge as usual."""
    if tm.spec.hardware.accelerator is Accelerator.CPU:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def build_service(tm: TunedModel) -> dict[str, Any]:
    name = tm.metadata.name
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(tm, ChildNames(name).service),
        "spec": {"type": "ClusterIP", "selector": selector_labels(name),
                 "ports": [{"name": "http", "port": RUNTIME_PORT, "targetPort": "http", "protocol": "TCP"}]},
    }


def build_secret(tm: TunedModel, token: str) -> dict[str, Any]:
    """The admin token Secret; created once and never overwritten, so running pods keep a valid token."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _metadata(tm, ChildNames(tm.metadata.name).secret),
        "stringData": {"token": token},
    }


def build_service_monitor(tm: TunedModel) -> dict[str, Any]:
    """Prometheus Operator scrape config; the `deployment` label is what slotune.metrics.promql selects on, `pod`
    what canary verification groups by."""
    names = ChildNames(tm.metadata.name)
    relabelings = [{"targetLabel": "deployment", "replacement": names.deployment, "action": "replace"},
                   # per-pod series for canary verification (slotune.metrics.per_pod), whatever the defaults
                   {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod", "action": "replace"}]
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": _metadata(tm, names.service_monitor),
        "spec": {
            "selector": {"matchLabels": selector_labels(tm.metadata.name)},
            "namespaceSelector": {"matchNames": [tm.metadata.namespace]},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s", "relabelings": relabelings}],
        },
    }
