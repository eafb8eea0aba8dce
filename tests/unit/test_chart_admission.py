"""The chart's runtime policy: the ValidatingAdmissionPolicy carries the operator's own deny-list and the values'
repositories, the operator gets the same values through its environment, and bad values are refused by name."""

from __future__ import annotations

import ast
import re

from slotune.manifests.admission import OPERATOR_FLAGS
from tests.unit.test_chart_render import CHART, helm, operator_container, render


def _policy(objects: list[dict]) -> dict:
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    return policy


def _variable(policy: dict, name: str) -> str:
    return next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name)


def test_policy_denies_the_operators_flags(helm_binary) -> None:
    owned = _variable(_policy(render(helm_binary)), "owned")
    literal = re.search(r"\[[^\]]*\]", owned).group(0)
    assert tuple(ast.literal_eval(literal)) == OPERATOR_FLAGS


def test_values_reach_policy_binding_and_operator(helm_binary) -> None:
    objects = render(helm_binary, "--set", "runtimePolicy.allowedImages.builtin={registry.local:5000/rt,ghcr.io/a}",
                     "--set", "runtimePolicy.allowExtraArgs=false", "--set", "runtimePolicy.allowRemoteCode=true")
    policy = _policy(objects)
    assert "['registry.local:5000/rt', 'ghcr.io/a']" in _variable(policy, "repositories")
    messages = " ".join(v.get("message", "") + v.get("messageExpression", "") for v in policy["spec"]["validations"])
    assert "rule extraArgs" in messages and "rule remoteCode" not in messages
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    env = {e["name"]: e.get("value") for e in operator_container(objects)["env"]}
    assert env["SLOTUNE_ALLOWED_BUILTIN_IMAGES"] == "registry.local:5000/rt,ghcr.io/a"
    assert (env["SLOTUNE_ALLOW_EXTRA_ARGS"], env["SLOTUNE_ALLOW_REMOTE_CODE"]) == ("false", "true")


def test_policy_can_be_left_to_the_operator(helm_binary) -> None:
    kinds = {o["kind"] for o in render(helm_binary, "--set", "runtimePolicy.admissionPolicy=false")}
    assert "ValidatingAdmissionPolicy" not in kinds and "Deployment" in kinds


def test_a_tag_or_a_quote_is_not_a_repository(helm_binary) -> None:
    for bad in ("ghcr.io/slotune/runtime:latest", "x'] || true || ['"):
        result = helm(helm_binary, "template", "s", str(CHART), "--set-json",
                      f'runtimePolicy.allowedImages.vllm=["{bad}"]', check=False)
        assert result.returncode != 0 and "allowedImages" in result.stderr, result.stderr
