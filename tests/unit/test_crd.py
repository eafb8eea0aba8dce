"""The committed CRD is the one generated from slotune.api, and it is a structural schema that teaches."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from slotune.api import TunedModelSpec, TunedModelStatus
from slotune.api.rules import rules_of
from slotune.api.schema import reachable_models
from slotune.commands.crdgen import CRD_PATH, PRINTER_COLUMNS, build_crd, render

FORBIDDEN = ("$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title", "uniqueItems")


def root_schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_the_generated_one() -> None:
    assert CRD_PATH.read_text() == render(), "crds/tunedmodel.yaml is stale: run `slotune crd --write`"


def test_committed_crd_parses_to_the_built_object() -> None:
    assert yaml.safe_load(CRD_PATH.read_text()) == build_crd()


def test_names_group_version_and_subresources() -> None:
    crd = build_crd()
    names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
    assert (crd["spec"]["group"], version["name"], names["plural"]) == ("slotune.io", "v1alpha1", "tunedmodels")
    assert names["shortNames"] == ["tm"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "SLO met", "TTFT P99", "TPOT P99", "Bottleneck", "Iteration", "Age"]


@pytest.mark.parametrize("part", ["spec", "status"])
def test_schema_is_structural(part: str) -> None:
    for path, node in walk(root_schema()["properties"][part], part):
        assert not set(FORBIDDEN) & set(node), f"{path} has {set(FORBIDDEN) & set(node)}"
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert node.get("additionalProperties") is not False, path
        if node.get("type") == "object":
            assert "properties" in node or "additionalProperties" in node or node.get(
                "x-kubernetes-preserve-unknown-fields"), path


@pytest.mark.parametrize("part", ["spec", "status"])
def test_every_field_has_a_description(part: str) -> None:
    undocumented = [p for p, node in walk(root_schema()["properties"][part], part)
                    if not p.endswith(("[]", "{}")) and not node.get("description")]
    assert undocumented == []


def test_spec_optionals_are_pruned_nulls_and_status_optionals_are_nullable() -> None:
    spec_paths = [p for p, node in walk(root_schema()["properties"]["spec"]) if node.get("nullable")]
    status = root_schema()["properties"]["status"]["properties"]
    assert spec_paths == []
    assert status["diagnosis"]["nullable"] is True and status["observed"]["properties"]["ttft"].get("nullable") is None


def test_bounds_enums_and_defaults_reach_the_schema() -> None:
    spec = root_schema()["properties"]["spec"]["properties"]
    assert spec["replicas"] == {"description": spec["replicas"]["description"], "type": "integer", "default": 1,
                                "maximum": 1024, "minimum": 1}
    p99 = spec["slo"]["properties"]["ttft"]["properties"]["p99"]
    assert (p99["minimum"], p99["exclusiveMinimum"]) == (0, True)
    assert "nvidia-h100-80gb" in spec["hardware"]["properties"]["accelerator"]["enum"]
    assert spec["tuning"]["default"]["bounds"]["maxNumSeqs"] == {"min": 1, "max": 1024}
    assert "replicas" not in spec["runtime"]["properties"]["config"]["properties"]
    assert "replicas" not in spec["runtime"]["default"]["config"]


def all_rule_messages(model: type) -> set[str]:
    return {r.message for m in reachable_models(model).values() for r in rules_of(m)}


@pytest.mark.parametrize(("part", "model"), [("spec", TunedModelSpec), ("status", TunedModelStatus)])
def test_every_rule_of_every_model_is_in_the_crd(part: str, model: type) -> None:
    in_crd = {v["message"] for _, node in walk(root_schema()["properties"][part])
              for v in node.get("x-kubernetes-validations", [])}
    assert all_rule_messages(model) == in_crd
    if part == "spec":
        assert len(in_crd) >= 20


def resolve(node: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    for name in dotted.split("."):
        node = node.get("properties", {}).get(name)
        if node is None:
            return None
    return node


def test_cel_rules_and_field_paths_name_fields_that_exist() -> None:
    checked = 0
    for path, node in walk(root_schema()["properties"]["spec"], "spec"):
        for validation in node.get("x-kubernetes-validations", []):
            cel = validation["rule"] + validation.get("messageExpression", "")
            for ref in re.findall(r"self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", cel):
                fields = [f for f in ref.lstrip(".").split(".") if f not in ("startsWith", "exists", "all", "matches")]
                assert resolve(node, ".".join(fields)) is not None, f"{path}: {validation['rule']} names {ref}"
                checked += 1
            if "fieldPath" in validation:
                assert resolve(node, validation["fieldPath"].lstrip(".")) is not None, (path, validation)
    assert checked > 30


def test_printer_columns_point_at_status_fields() -> None:
    status = root_schema()["properties"]["status"]
    for column in PRINTER_COLUMNS:
        if column["jsonPath"].startswith(".status."):
            target = resolve(status, column["jsonPath"].removeprefix(".status."))
            assert target is not None, column
            assert target["type"] == column["type"], column


def test_descriptions_teach_defaults_bounds_and_rules() -> None:
    """`kubectl explain` prints only descriptions, so they carry what the schema says besides."""
    spec = root_schema()["properties"]["spec"]["properties"]
    tuning = spec["tuning"]["properties"]
    assert tuning["windowSeconds"]["description"].endswith("Default: 60. From 5 to 3600.")
    assert tuning["allowQualityChange"]["description"].endswith("Default: false.")
    assert "Greater than 0." in spec["slo"]["properties"]["ttft"]["properties"]["p99"]["description"]
    assert "Rules: quantization and kv_cache_dtype change model outputs" in spec["tuning"]["description"]
