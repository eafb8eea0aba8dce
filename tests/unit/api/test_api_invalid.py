"""The Python loader refuses every manifest of the shared invalid table, naming the field and the rule."""

from __future__ import annotations

import pytest

from slotune.api import InvalidTunedModel, parse_tunedmodel
from tests.unit.api_cases import BASE, invalid_cases, merge_patch

CASES = invalid_cases()


def test_the_table_has_at_least_15_distinct_faults() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 15
    assert len({(c.path, c.python_message) for c in CASES}) == len(CASES)


def test_the_base_manifest_is_valid() -> None:
    import yaml

    parse_tunedmodel(yaml.safe_load(BASE.read_text()))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_loader_refuses_with_field_path_and_rule(case) -> None:
    with pytest.raises(InvalidTunedModel) as refused:
        parse_tunedmodel(case.manifest)
    errors = refused.value.errors
    assert any(e.path == case.path and case.python_message in e.message for e in errors), [str(e) for e in errors]
    assert case.manifest["metadata"]["name"] in str(refused.value)


def test_merge_patch_follows_rfc_7386() -> None:
    # The example from RFC 7386 section 3.
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    patch = {"a": "z", "c": {"f": None}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}
