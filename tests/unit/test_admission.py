"""The operator's twin of the runtime policy (slotune.manifests.admission) gives the verdicts and messages of the shared
cases, which tests/integration/test_admission_policy.py also holds the chart's ValidatingAdmissionPolicy to."""

from __future__ import annotations

import pytest

from slotune.api import parse_tunedmodel
from slotune.manifests.admission import OPERATOR_FLAGS, RuntimePolicy, image_allowed, violations
from slotune.manifests.resources import engine_args
from slotune.settings import load_settings
from tests.unit.runtime_policy_cases import DEFAULT_POLICY_CASES, STRICT_ARGS_CASES, PolicyCase, message

STRICT = RuntimePolicy(allow_extra_args=False, allow_remote_code=True)


def spec_of(case: PolicyCase):
    model = {"name": "m", "source": "hf://org/model"} | case.model
    return parse_tunedmodel({
        "apiVersion": "slotune.io/v1alpha1", "kind": "TunedModel",
        "metadata": {"name": case.name, "namespace": "ns", "uid": "u-1"},
        "spec": {"model": model, "hardware": {"accelerator": "nvidia-l4"}, "slo": {"ttft": {"p99": 500}},
                 "runtime": case.runtime},
    })


@pytest.mark.parametrize("case", DEFAULT_POLICY_CASES, ids=lambda c: c.name)
def test_default_policy(case: PolicyCase) -> None:
    found = violations(spec_of(case).spec, RuntimePolicy())
    assert [v.rule for v in found][:1] == ([case.refused_by] if case.refused_by else [])
    if case.refused_by:
        assert str(found[0]) == message(case)


@pytest.mark.parametrize("case", STRICT_ARGS_CASES, ids=lambda c: c.name)
def test_no_extra_args_policy(case: PolicyCase) -> None:
    found = violations(spec_of(case).spec, STRICT)
    assert [v.rule for v in found][:1] == ([case.refused_by] if case.refused_by else [])
    if case.refused_by:
        assert str(found[0]) == message(case)


def test_every_rule_broken_is_named() -> None:
    case = PolicyCase("all", {"image": "evil.example.com/x:1", "extraArgs": ["--port", "1", "--trust-remote-code"]},
                      "image")
    assert [v.rule for v in violations(spec_of(case).spec, RuntimePolicy())] == ["image", "operatorFlag",
                                                                                   "remoteCode"]


def test_remote_code_allowed_by_the_admin() -> None:
    case = PolicyCase("trust", {"extraArgs": ["--trust-remote-code"]}, None)
    assert violations(spec_of(case).spec, RuntimePolicy(allow_remote_code=True)) == []


def test_the_operator_flags_it_renders_are_all_owned() -> None:
    """Every flag engine_args renders before extraArgs is on the deny-list, so extraArgs cannot override one."""
    for engine in ("builtin", "vllm"):
        tm = spec_of(PolicyCase("owned", {"engine": engine}, None, model={"revision": "main", "maxModelLen": 4096,
                                                                         "dtype": "bfloat16"}))
        rendered = {a.split("=")[0] for a in engine_args(tm, tm.spec.initial_config()) if a.startswith("-")}
        assert rendered <= set(OPERATOR_FLAGS), rendered - set(OPERATOR_FLAGS)


def test_revision_stays_a_value() -> None:
    tm = spec_of(PolicyCase("rev", {"engine": "vllm"}, None, model={"revision": "--trust-remote-code"}))
    args = engine_args(tm, tm.spec.initial_config())
    assert "--revision=--trust-remote-code" in args and "--trust-remote-code" not in args


@pytest.mark.parametrize(("image", "allowed"), [
    ("ghcr.io/slotune/runtime", True), ("ghcr.io/slotune/runtime:1", True), ("ghcr.io/slotune/runtime/gpu:1", True),
    ("ghcr.io/slotune/runtime-x:1", False), ("ghcr.io/slotune/runtim:1", False), ("ghcr.io/slotune", False),
])
def test_image_repositories_match_whole_path_segments(image: str, allowed: bool) -> None:
    assert image_allowed(image, ("ghcr.io/slotune/runtime",)) is allowed


def test_policy_from_the_charts_environment() -> None:
    settings = load_settings(environ={
        "SLOTUNE_ALLOWED_BUILTIN_IMAGES": "a.io/x, b.io/y", "SLOTUNE_ALLOWED_VLLM_IMAGES": "",
        "SLOTUNE_ALLOW_EXTRA_ARGS": "false", "SLOTUNE_ALLOW_REMOTE_CODE": "True"})
    policy = RuntimePolicy.of(settings)
    assert policy == RuntimePolicy(builtin_images=("a.io/x", "b.io/y"), vllm_images=(), allow_extra_args=False,
                                   allow_remote_code=True)
    with pytest.raises(ValueError, match="SLOTUNE_ALLOW_EXTRA_ARGS must be true or false"):
        load_settings(environ={"SLOTUNE_ALLOW_EXTRA_ARGS": "yes"})
