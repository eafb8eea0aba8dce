"""Cases of the runtime policy (slotune.manifests.admission), shared by the operator-side unit test and the API server
test, so the ValidatingAdmissionPolicy the chart renders and the operator's Python twin are held to the same
verdicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PolicyCase:
    name: str
    runtime: dict[str, Any]  # spec.runtime of the TunedModel
    refused_by: str | None  # the first rule broken, None: allowed
    flag: str = ""  # the flag the message names
    model: dict[str, Any] = field(default_factory=dict)  # extra spec.model fields


# Under the chart's default values: the project's images, extraArgs allowed, remote code not trusted.
DEFAULT_POLICY_CASES = (
    PolicyCase("default-image", {}, None),
    PolicyCase("own-image-tag", {"image": "ghcr.io/slotune/runtime:0.2.0-cpu"}, None),
    PolicyCase("own-image-digest", {"image": "ghcr.io/slotune/runtime@sha256:" + "a" * 64}, None),
    PolicyCase("vllm-image", {"engine": "vllm", "image": "vllm/vllm-openai:v0.11.0"}, None),
    PolicyCase("evil-image", {"image": "evil.example.com/cryptominer:latest"}, "image"),
    PolicyCase("lookalike-image", {"image": "ghcr.io/slotune/runtime-evil:1"}, "image"),
    PolicyCase("vllm-image-on-builtin", {"image": "vllm/vllm-openai:v0.11.0"}, "image"),
    PolicyCase("harmless-extra-args", {"extraArgs": ["--max-waiting-requests", "64", "--disable-log-requests"]}, None),
    PolicyCase("port-override", {"extraArgs": ["--port", "9999"]}, "operatorFlag", "--port"),
    PolicyCase("token-override", {"extraArgs": ["--admin-token-file", "/etc/hostname"]}, "operatorFlag",
               "--admin-token-file"),
    PolicyCase("port-and-token", {"extraArgs": ["--port", "9999", "--admin-token-file", "/etc/hostname"]},
               "operatorFlag", "--port"),
    PolicyCase("equals-form", {"extraArgs": ["--host=0.0.0.0"]}, "operatorFlag", "--host"),
    PolicyCase("underscore-form", {"extraArgs": ["--admin_token_file=/etc/hostname"]}, "operatorFlag",
               "--admin-token-file"),
    PolicyCase("abbreviation", {"extraArgs": ["--po", "9999"]}, "operatorFlag", "--po"),
    PolicyCase("knob-override", {"extraArgs": ["--max-num-seqs=4"]}, "operatorFlag", "--max-num-seqs"),
    PolicyCase("config-file", {"extraArgs": ["--config", "/tmp/args.yaml"]}, "operatorFlag", "--config"),
    PolicyCase("trust-remote-code", {"extraArgs": ["--trust-remote-code"]}, "remoteCode", "--trust-remote-code"),
    PolicyCase("trust-remote-code-vllm", {"engine": "vllm", "extraArgs": ["--trust_remote_code"]}, "remoteCode",
               "--trust-remote-code"),
    # A revision is rendered --revision=VALUE: whatever it says stays a value, never a flag.
    PolicyCase("revision-flag", {"engine": "vllm"}, None, model={"revision": "--trust-remote-code"}),
)

# Under allowExtraArgs: false, allowRemoteCode: true.
STRICT_ARGS_CASES = (
    PolicyCase("no-extra-args", {}, None),
    PolicyCase("any-extra-args", {"extraArgs": ["--disable-log-requests"]}, "extraArgs"),
    PolicyCase("remote-code-still-an-arg", {"extraArgs": ["--trust-remote-code"]}, "extraArgs"),
)


def message(case: PolicyCase, engine: str = "builtin", repositories: str = "ghcr.io/slotune/runtime") -> str:
    """The message both enforcers give for the case's first broken rule."""
    image = case.runtime.get("image", "")
    return {
        "image": f"spec.runtime.image: {image} is not an allowed {case.runtime.get('engine', engine)} image "
                 f"(allowed repositories: {repositories}) (runtime policy rule image)",
        "extraArgs": "spec.runtime.extraArgs: the cluster policy allows no extraArgs (runtime policy rule extraArgs)",
        "operatorFlag": f"spec.runtime.extraArgs: {case.flag} is set by the operator and cannot be overridden "
                        "(runtime policy rule operatorFlag)",
        "remoteCode": f"spec.runtime.extraArgs: {case.flag} is not allowed: the cluster policy does not trust remote "
                      "code (runtime policy rule remoteCode)",
    }[case.refused_by or ""]
