"""The whole `TunedModel` object and loading it from YAML with errors as clear as the API server's.

`load_tunedmodels` parses a (multi-document) YAML file into `TunedModel`s or raises `InvalidTunedModel`, whose
`errors` name each bad field by its wire path (`spec.tuning.bounds.maxReplicas`) and say which rule it broke, the
way `kubectl apply` reports a refused manifest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from slotune.api.rules import RULE_ERROR
from slotune.api.spec import TunedModelSpec
from slotune.api.status import TunedModelStatus

GROUP = "slotune.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TunedModel"
PLURAL = "tunedmodels"


@dataclass(frozen=True)
class NameRule:
    """What a TunedModel's name must be for its children to be valid: the Service `NAME-runtime` is a DNS-1035
    label (lowercase letters, digits and '-', starting with a letter, at most 63 characters), so the name is one
    too, 8 characters shorter. The API server checks the same rule (CEL on metadata.name) at apply time."""

    max_length: int = 63 - len("-runtime")
    pattern: str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

    @property
    def message(self) -> str:
        return (f"metadata.name must be a DNS-1035 label of at most {self.max_length} characters (lowercase letters, "
                "digits and '-', starting with a letter), so that its children NAME-runtime and NAME-admin-token "
                "are valid names")

    @property
    def cel(self) -> str:
        return f"self.metadata.name.matches('{self.pattern}') && size(self.metadata.name) <= {self.max_length}"

    def holds(self, name: str) -> bool:
        return len(name) <= self.max_length and re.fullmatch(self.pattern, name) is not None


NAME_RULE = NameRule()


class ObjectMeta(BaseModel):
    """The part of metav1.ObjectMeta slotune reads; the rest passes through untouched."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


    @field_validator("name")
    @classmethod
    def _child_names(cls, name: str) -> str:
        if not NAME_RULE.holds(name):
            raise ValueError(NAME_RULE.message)
        return name


class TunedModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    api_version: Literal["slotune.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["TunedModel"] = KIND
    metadata: ObjectMeta
    spec: TunedModelSpec
    status: TunedModelStatus | None = None

    def wire(self) -> dict[str, Any]:
        """The manifest as the API server stores it: camelCase, defaults filled in, absent fields left out."""
        # spec.runtime.config.replicas is not part of the API: spec.replicas says how many replicas start.
        omit = {"spec": {"runtime": {"config": {"replicas"}}}}
        body = self.model_dump(by_alias=True, mode="json", exclude_none=True, exclude=omit)
        body["metadata"] = {k: v for k, v in body["metadata"].items() if v != {}}
        return body


@dataclass(frozen=True)
class FieldError:
    path: str  # wire path, e.g. spec.slo.ttft or spec.tuning.knobs[2]
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidTunedModel(ValueError):
    def __init__(self, name: str, errors: list[FieldError]) -> None:
        self.name = name
        self.errors = errors
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f'TunedModel "{name}" is invalid:\n{lines}')


def wire_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def field_errors(error: ValidationError) -> list[FieldError]:
    found = []
    for detail in error.errors(include_url=False):
        loc = tuple(p for p in detail["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        path = wire_path(loc)
        if detail["type"] == RULE_ERROR:
            path += detail.get("ctx", {}).get("field_path", "")
        message = detail["msg"].removeprefix("Value error, ")
        if detail["type"] in {"missing", "extra_forbidden"}:
            message = "Required value" if detail["type"] == "missing" else f"unknown field {loc[-1]!r}"
        found.append(FieldError(path or "<root>", message))
    return found


def parse_tunedmodel(body: Any) -> TunedModel:
    """A TunedModel from a decoded manifest (a dict from YAML or the API server)."""
    name = body.get("metadata", {}).get("name", "<unnamed>") if isinstance(body, dict) else "<unnamed>"
    if not isinstance(body, dict):
        raise InvalidTunedModel(name, [FieldError("<root>", "a TunedModel must be a mapping")])
    try:
        return TunedModel.model_validate(body)
    except ValidationError as error:
        raise InvalidTunedModel(name, field_errors(error)) from None


def load_tunedmodels(source: str | Path) -> list[TunedModel]:
    """Every TunedModel in a YAML file (or YAML text); documents of other kinds are refused."""
    text = Path(source).read_text() if isinstance(source, Path) else source
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InvalidTunedModel("<file>", [FieldError("<yaml>", str(error))]) from None
    return [parse_tunedmodel(d) for d in documents]


def load_tunedmodel(source: str | Path) -> TunedModel:
    """The one TunedModel in a YAML file (or YAML text)."""
    models = load_tunedmodels(source)
    if len(models) != 1:
        raise InvalidTunedModel("<file>", [FieldError("<root>", f"expected one TunedModel, found {len(models)}")])
    return models[0]
