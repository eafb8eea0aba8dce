"""The committed TunedModel reference is what the API models generate, and it covers every spec field."""

from __future__ import annotations

from slotune.commands.apidocs import DOCS_PATH, render
from slotune.commands.crdgen import openapi_schema


def test_committed_reference_is_generated() -> None:
    assert DOCS_PATH.read_text() == render(), "run `slotune api-docs --write` and commit docs/tunedmodel-reference.md"


def test_every_spec_field_has_a_row_with_a_description() -> None:
    text = render()

    def walk(node: dict, path: str) -> None:
        assert f"`{path}`" in text
        children = node.get("properties") or node.get("items", {}).get("properties", {})
        suffix = "[]" if node.get("type") == "array" else ""
        for name, child in children.items():
            assert child.get("description"), f"{path}{suffix}.{name} has no description"
            walk(child, f"{path}{suffix}.{name}")

    walk(openapi_schema()["properties"]["spec"], "spec")
