"""The children a TunedModel renders to: engine args, GPUs, node selection, security, ownership
(slotune.manifests.resources)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slotune.api import Accelerator, TunedModel, parse_tunedmodel
from slotune.knobs import RuntimeConfig, SpeculativeConfig, SpeculativeMethod
from slotune.manifests.resources import (
    ADMIN_TOKEN_FILE,
    GPU_PRODUCTS,
    build_deployment,
    build_secret,
    build_service,
    build_service_monitor,
    config_from_annotation,
)
from slotune.settings import OperatorSettings

SETTINGS = OperatorSettings(runtime_image="img/runtime:cuda", runtime_image_cpu="img/runtime:cpu",
                            vllm_image="img/vllm:1")


def tunedmodel(**spec: Any) -> TunedModel:
    body = {
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "1234-uid", "generation": 1},
        "spec": {"model": {"name": "llama", "source": "hf://org/llama"},
                 "hardware": {"accelerator": "nvidia-h100-80gb", "count": 2},
                 "slo": {"ttft": {"p99": 500}}} | spec,
    }
    return parse_tunedmodel(body)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return found


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_builtin_args_carry_model_port_token_and_every_knob() -> None:
    tm = tunedmodel(model={"name": "tiny", "source": "builtin://tiny", "maxModelLen": 512},
                    hardware={"accelerator": "cpu", "count": 0})
    config = RuntimeConfig(max_num_seqs=3, max_num_batched_tokens=128, enable_prefix_caching=False, replicas=2)
    deployment = build_deployment(tm, config, SETTINGS)
    runtime = container(deployment)
    args = runtime["args"]
    assert runtime["command"] == ["python", "-m", "gpu_runtime", "serve"]
    assert flag_value(args, "--model") == "builtin://tiny"
    assert flag_value(args, "--served-model-name") == "tiny"
    assert flag_value(args, "--port") == "8000"
    assert flag_value(args, "--admin-token-file") == ADMIN_TOKEN_FILE
    assert flag_value(args, "--device") == "cpu"
    assert flag_value(args, "--max-model-len") == "512"
    for flag in config.engine_args():
        assert flag in args
    assert "--no-enable-prefix-caching" in args
    assert runtime["image"] == "img/runtime:cpu"
    assert deployment["spec"]["replicas"] == 2
    assert config_from_annotation(deployment) == config


def test_vllm_renders_vllm_serve_with_speculative_json_and_tensor_parallel() -> None:
    tm = tunedmodel(runtime={"engine": "vllm", "extraArgs": ["--enforce-eager"]})
    speculative = SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=5)
    config = RuntimeConfig(speculative=speculative)
    runtime = container(build_deployment(tm, config, SETTINGS))
    args = runtime["args"]
    assert runtime["command"] == ["vllm", "serve"]
    assert runtime["image"] == "img/vllm:1"
    assert args[0] == "org/llama"
    assert flag_value(args, "--tensor-parallel-size") == "2"
    spec_flag = next(a for a in args if a.startswith("--speculative-config="))
    assert json.loads(spec_flag.split("=", 1)[1]) == {"method": "ngram", "num_speculative_tokens": 5,
                                                     "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    assert "--admin-token-file" not in args  # vLLM has no admin API
    assert args[-1] == "--enforce-eager"


@pytest.mark.parametrize("accelerator", [a for a in Accelerator if a is not Accelerator.CPU])
def test_gpu_pods_request_their_gpus_on_the_matching_product(accelerator: Accelerator) -> None:
    tm = tunedmodel(hardware={"accelerator": accelerator.value, "count": 4, "nodeSelector": {"pool": "gpu"}})
    deployment = build_deployment(tm, RuntimeConfig(), SETTINGS)
    pod = deployment["spec"]["template"]["spec"]
    limits = container(deployment)["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": GPU_PRODUCTS[accelerator], "pool": "gpu"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container(deployment)["image"] == "img/runtime:cuda"


def test_kwok_node_products_match_the_accelerators_they_stand_for() -> None:
    assert GPU_PRODUCTS[Accelerator.NVIDIA_H100_80GB] == "NVIDIA-H100-80GB-HBM3"
    assert GPU_PRODUCTS[Accelerator.NVIDIA_A100_40GB] == "NVIDIA-A100-SXM4-40GB"


def test_user_node_selector_wins_and_cpu_needs_no_gpu() -> None:
    gpu = tunedmodel(hardware={"accelerator": "nvidia-l4", "count": 1,
                               "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4-custom"}})
    pod = build_deployment(gpu, RuntimeConfig(), SETTINGS)["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4-custom"
    cpu = tunedmodel(hardware={"accelerator": "cpu", "count": 0},
                     runtime={"resources": {"requests": {"cpu": 2}, "limits": {"memory": "4Gi"}}})
    deployment = build_deployment(cpu, RuntimeConfig(), SETTINGS)
    assert "nodeSelector" not in deployment["spec"]["template"]["spec"]
    assert container(deployment)["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}}


def test_runtime_runs_non_root_read_only_with_writable_scratch_and_the_token_mounted() -> None:
    deployment = build_deployment(tunedmodel(), RuntimeConfig(), SETTINGS)
    pod = deployment["spec"]["template"]["spec"]
    runtime = container(deployment)
    assert runtime["securityContext"]["runAsNonRoot"] is True
    assert runtime["securityContext"]["readOnlyRootFilesystem"] is True
    assert runtime["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m["name"] for m in runtime["volumeMounts"]}
    assert mounts["/tmp"] == "tmp"
    assert mounts["/var/run/slotune"] == "admin-token"
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "admin-token")
    assert secret_volume["secret"]["secretName"] == "chat-admin-token"
    assert "/var/run/slotune/" + secret_volume["secret"]["items"][0]["path"] == ADMIN_TOKEN_FILE
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert runtime[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert runtime["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                                {"name": "admin", "containerPort": 8001, "protocol": "TCP"}]  # --admin-port alone
    assert flag_value(runtime["args"], "--admin-port") == "8001"


def test_every_child_is_labelled_and_owned_by_the_tunedmodel() -> None:
    tm = tunedmodel()
    children = [build_deployment(tm, RuntimeConfig(), SETTINGS), build_service(tm), build_secret(tm, "t0k"),
                build_service_monitor(tm)]
    names = [c["metadata"]["name"] for c in children]
    assert names == ["chat-runtime", "chat-runtime", "chat-admin-token", "chat-runtime"]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["labels"] == {"app.kubernetes.io/name": "slotune-runtime", "app.kubernetes.io/instance": "chat",
                                  "app.kubernetes.io/managed-by": "slotune", "slotune.io/tunedmodel": "chat"}
        (owner,) = meta["ownerReferences"]
        assert owner == {"apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel", "name": "chat",
                         "uid": "1234-uid", "controller": True, "blockOwnerDeletion": True}


def test_service_selects_the_pods_and_monitor_adds_the_deployment_label() -> None:
    tm = tunedmodel()
    deployment = build_deployment(tm, RuntimeConfig(), SETTINGS)
    service = build_service(tm)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["name"] == "http"
    monitor = build_service_monitor(tm)
    relabel = monitor["spec"]["endpoints"][0]["relabelings"][0]
    assert (relabel["targetLabel"], relabel["replacement"]) == ("deployment", "chat-runtime")
    by_pod = monitor["spec"]["endpoints"][0]["relabelings"][1]  # canary verification reads series per pod
    assert (by_pod["sourceLabels"], by_pod["targetLabel"]) == (["__meta_kubernetes_pod_name"], "pod")


def test_secret_holds_the_token_and_pvc_sources_are_mounted() -> None:
    assert build_secret(tunedmodel(), "s3cret")["stringData"] == {"token": "s3cret"}
    tm = tunedmodel(model={"name": "m", "source": "pvc://weights/llama/8b"})
    deployment = build_deployment(tm, RuntimeConfig(), SETTINGS)
    assert flag_value(container(deployment)["args"], "--model") == "/models/weights/llama/8b"
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}


@pytest.mark.parametrize(("draft", "path", "claim"), [
    ("hf://org/llama-1b", "org/llama-1b", None),
    ("pvc://drafts/llama/1b", "/models/drafts/llama/1b", "drafts"),
    ("pvc://weights/llama/1b", "/models/weights/llama/1b", None),  # the model's own claim: mounted once
])
def test_a_draft_model_is_deployed_as_the_path_the_engine_reads(draft: str, path: str, claim: str | None) -> None:
    tm = tunedmodel(model={"name": "m", "source": "pvc://weights/llama/8b", "draftModel": draft},
                    runtime={"engine": "vllm"})
    config = RuntimeConfig(speculative=SpeculativeConfig(method=SpeculativeMethod.DRAFT_MODEL, draft_model=draft))
    deployment = build_deployment(tm, config, SETTINGS)
    spec_flag = next(a for a in container(deployment)["args"] if a.startswith("--speculative-config="))
    assert json.loads(spec_flag.split("=", 1)[1])["model"] == path
    claims = [v["persistentVolumeClaim"]["claimName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["weights", *([claim] if claim else [])]
    assert config_from_annotation(deployment) == config  # the annotation keeps the source, as the status does


def test_a_tunedmodel_without_uid_cannot_own_children() -> None:
    body = tunedmodel().wire()
    body["metadata"].pop("uid")
    with pytest.raises(ValueError, match="uid"):
        build_service(parse_tunedmodel(body))


def test_the_pod_template_names_the_token_secret_it_reads() -> None:
    """A new admin Secret (rotation) changes the template, so the pods restart and read the new token."""
    tm = tunedmodel()
    plain = build_deployment(tm, RuntimeConfig(), SETTINGS)["spec"]["template"]["metadata"]
    assert "annotations" not in plain
    named = build_deployment(tm, RuntimeConfig(), SETTINGS, "uid-2")["spec"]["template"]["metadata"]
    assert named["annotations"] == {"slotune.io/admin-token-secret-uid": "uid-2"}


def test_runtime_container_meets_pod_security_restricted() -> None:
    pod = build_deployment(tunedmodel(), RuntimeConfig(), SETTINGS)["spec"]["template"]["spec"]
    context = container({"spec": {"template": {"spec": pod}}})["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"]
    assert context["seccompProfile"] == pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"emptyDir", "secret"} >= {key for v in pod["volumes"] for key in v if key != "name"}
