"""Structural OpenAPI v3 schemas for the CRD, generated from the pydantic models (the single source of truth).

Pydantic emits JSON Schema 2020-12; Kubernetes wants a structural OpenAPI v3.0 subset: no `$ref`, no `anyOf` with
null, `exclusiveMinimum` as a flag, no `additionalProperties: false` next to `properties`, `x-kubernetes-int-or-string`
for quantities, and defaults that validate against the pruned schema. `structural_schema` does that rewrite and
attaches each model's `Rule`s as `x-kubernetes-validations`.

Optional fields: in the spec an absent field and a null one mean the same, so nulls are left non-nullable and the API
server prunes them (which keeps CEL's `has()` exact); in the status, written by slotune, they are `nullable: true`.
"""

from __future__ import annotations

import copy
import types
import typing
from typing import Any

from pydantic import BaseModel

from slotune.api.rules import rules_of

OMIT = "x-slotune-omit"  # marker on a field: drop these properties of the referenced model (see RuntimeSpec.config)
_DROPPED = ("title", "additionalProperties", "$defs")


def reachable_models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class reachable from root's fields, by class name (pydantic's `$defs` keys)."""
    found: dict[str, type[BaseModel]] = {}
    pending: list[Any] = [root]
    while pending:
        kind = pending.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            if kind.__name__ in found:
                continue
            found[kind.__name__] = kind
            pending += [f.annotation for f in kind.model_fields.values()]
        elif isinstance(kind, types.UnionType) or typing.get_origin(kind) is not None:
            pending += list(typing.get_args(kind))
    return found


def structural_schema(root: type[BaseModel], *, nullable: bool) -> dict[str, Any]:
    raw = root.model_json_schema(by_alias=True, mode="validation")
    converter = _Converter(raw.get("$defs", {}), reachable_models(root), nullable)
    schema = converter.convert(raw, root.__name__)
    prune_defaults(schema)
    teach(schema)
    return ordered(schema)


def teach(schema: dict[str, Any]) -> None:
    """Append defaults, bounds and cross-field rules to descriptions: `kubectl explain` shows only descriptions."""
    notes = []
    default = schema.get("default")
    if default is not None and not isinstance(default, dict):
        shown = ", ".join(map(_word, default)) if isinstance(default, list) else _word(default)
        notes.append(f"Default: {shown or 'none'}.")
    bounds = _bounds(schema)
    if bounds:
        notes.append(f"{bounds}.")
    rules = [v["message"] for v in schema.get("x-kubernetes-validations", [])]
    if rules:
        notes.append("Rules: " + "; ".join(rules) + ".")
    if notes and schema.get("description"):
        schema["description"] = " ".join([schema["description"], *notes])
    for child in schema.get("properties", {}).values():
        teach(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            teach(schema[key])


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _bounds(schema: dict[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and schema.get("exclusiveMinimum"):
        return f"Greater than {low}" + (f", at most {high}" if high is not None else "")
    if low is not None and high is not None:
        return f"From {low} to {high}"
    if low is not None:
        return f"At least {low}"
    return f"At most {high}" if high is not None else ""


def ordered(schema: Any) -> Any:
    """Keys in reading order (description, type, constraints, properties last) so the CRD file reads well."""
    if isinstance(schema, list):
        return [ordered(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    first = [k for k in ("description", "type") if k in schema]
    last = [k for k in ("properties", "items", "additionalProperties", "x-kubernetes-validations") if k in schema]
    middle = sorted(k for k in schema if k not in first and k not in last)
    return {k: schema[k] if k in ("default", "enum") else ordered(schema[k]) for k in first + middle + last}


class _Converter:
    def __init__(self, defs: dict[str, Any], models: dict[str, type[BaseModel]], nullable: bool) -> None:
        self.defs = defs
        self.models = models
        self.nullable = nullable

    def convert(self, node: dict[str, Any], model_name: str | None = None) -> dict[str, Any]:
        node = self._resolve(node)
        if "anyOf" in node:
            node = self._collapse_any_of(node)
        out = {k: v for k, v in node.items() if k not in _DROPPED and k != "$ref"}
        model_name = model_name or node.get("title")
        if "properties" in node:
            out |= self._object(node, model_name)
        elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = self.convert(node["additionalProperties"])
        elif node.get("type") == "object" and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["x-kubernetes-preserve-unknown-fields"] = True
        if "items" in node:
            out["items"] = self.convert(node["items"])
        if "exclusiveMinimum" in node:
            out |= {"minimum": node["exclusiveMinimum"], "exclusiveMinimum": True}
        if "const" in node:
            out["enum"] = [out.pop("const")]
        return out

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        """Inline a `$ref`; the field's own keys (description, default) win over the referenced model's."""
        if "$ref" not in node:
            return node
        name = node["$ref"].rsplit("/", 1)[-1]
        target = copy.deepcopy(self.defs[name])
        target["title"] = name
        omitted = node.get(OMIT, [])
        for prop in omitted:
            target["properties"].pop(prop, None)
        if "required" in target:
            target["required"] = [r for r in target["required"] if r not in omitted]
        local = {k: v for k, v in node.items() if k not in ("$ref", OMIT)}
        return target | local

    def _collapse_any_of(self, node: dict[str, Any]) -> dict[str, Any]:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == len(node["anyOf"]) and {o.get("type") for o in options} == {"integer", "string"}:
            # A quantity's pattern (its string form) and minimum (its integer form) stay, as controller-gen keeps a
            # Quantity's: the API server then names the field and value of `cpu: lots`, not a child's conversion error.
            lifted = {k: v for o in options for k, v in o.items() if k in ("pattern", "minimum")}
            return rest | lifted | {"x-kubernetes-int-or-string": True}
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} in a structural schema")
        merged = self._resolve(options[0]) | rest
        if self.nullable:
            merged["nullable"] = True
        return merged

    def _object(self, node: dict[str, Any], model_name: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": {}}
        for name, prop in node["properties"].items():
            out["properties"][name] = self.convert(prop)
        if node.get("required"):
            out["required"] = list(node["required"])
        model = self.models.get(model_name or "")
        rules = rules_of(model) if model is not None else ()
        if rules:
            out["x-kubernetes-validations"] = [r.schema() for r in rules]
        return out


def prune_defaults(schema: dict[str, Any]) -> None:
    """Make every `default` validate against its own schema: drop nulls and fields the schema omits."""
    if "default" in schema:
        schema["default"] = _pruned(schema["default"], schema)
        if schema["default"] is None:
            del schema["default"]
    for child in schema.get("properties", {}).values():
        prune_defaults(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            prune_defaults(schema[key])


def _pruned(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        return {k: _pruned(v, props[k]) for k, v in value.items() if k in props and v is not None}
    if isinstance(value, list) and "items" in schema:
        return [_pruned(v, schema["items"]) for v in value]
    return value
