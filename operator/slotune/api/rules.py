"""Cross-field rules of the TunedModel API, stated once for both places that enforce them.

A `Rule` carries a CEL expression (the API server evaluates it as an `x-kubernetes-validations` entry of the CRD),
the message both enforcers print, and a Python predicate the loader evaluates, so `slotune validate` refuses what
`kubectl apply` refuses. `ApiModel` is the base of every model this package owns: camelCase on the wire, frozen,
unknown fields refused, and its class-level `RULES` checked after field validation.

Models owned elsewhere (`SLOSpec`, `SpeculativeConfig`, `WorkloadSpec`) enforce their rules in their own pydantic
validators; `FOREIGN_RULES` gives the CEL twin of each so the API server refuses the same manifests.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from slotune.knobs import SpeculativeConfig
from slotune.slo import PercentileTargets, SLOSpec
from slotune.workload import LengthDistribution, WorkloadSpec

RULE_ERROR = "cel_rule"


def wire_name(name: str) -> str:
    """camelCase wire name of a Python field; the `_s` / `_per_s` unit suffixes read as Kubernetes spells them."""
    name = re.sub(r"_per_s$", "_per_second", name)
    name = re.sub(r"_s$", "_seconds", name)
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)  # not to_camel: it spells e2e as e2E


@dataclass(frozen=True)
class Rule:
    """One cross-field rule: CEL for the API server, a predicate for Python, one message for both.

    `values` are CEL paths (`self.replicas`) whose values both enforcers append to the message, so the user sees
    what they wrote next to the rule it broke; the API server gets them through `messageExpression`.
    """

    cel: str
    message: str
    field_path: str = ""  # relative to the object the rule sits on, e.g. ".tuning.bounds.maxReplicas"
    holds: Callable[[Any], bool] | None = None  # None: a foreign model's own validator enforces it
    values: tuple[str, ...] = ()

    def schema(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": self.message}
        if self.values:
            # format(), not string() and +: the API server's cost estimate refuses string() of a number.
            assert not {"'", "%"} & set(self.message), "messages are embedded in a CEL format string"
            shown = ", ".join(f"{_label(path)}: %s" for path in self.values)
            entry["messageExpression"] = f"'{self.message} ({shown})'.format([{', '.join(self.values)}])"
        if self.field_path:
            entry |= {"fieldPath": self.field_path, "reason": "FieldValueInvalid"}
        return entry

    def explain(self, model: BaseModel) -> str:
        """The message with the values the user wrote, worded as the API server's messageExpression words it."""
        if not self.values:
            return self.message
        shown = ", ".join(f"{_label(path)}: {_show(_lookup(model, path))}" for path in self.values)
        return f"{self.message} ({shown})"


def _label(path: str) -> str:
    return path.removeprefix("self.")


def _lookup(model: Any, path: str) -> Any:
    """Follow a CEL path of wire names (`self.tuning.bounds.maxReplicas`) through the models."""
    for name in _label(path).split("."):
        fields = type(model).model_fields
        model = getattr(model, next(f for f, info in fields.items() if name in (f, info.alias)))
    return model


def _show(value: Any) -> str:
    # CEL's %s prints doubles in shortest form (600, 0.05, 812.5) and enums as their string value.
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(getattr(value, "value", value))


class ApiModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=wire_name, populate_by_name=True)

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in self.RULES:
            if rule.holds is not None and not rule.holds(self):
                raise PydanticCustomError(RULE_ERROR, "{message}", {"message": rule.explain(self),
                                                                    "field_path": rule.field_path})
        return self


def _ordered(low: str, high: str) -> str:
    return f"!has(self.{low}) || !has(self.{high}) || self.{low} <= self.{high}"


FOREIGN_RULES: dict[type[BaseModel], tuple[Rule, ...]] = {
    PercentileTargets: (
        Rule("has(self.p50) || has(self.p95) || has(self.p99)", "set at least one of p50, p95, p99"),
        Rule(_ordered("p50", "p95"), "p50 must not exceed p95", values=("self.p50", "self.p95")),
        Rule(_ordered("p95", "p99"), "p95 must not exceed p99", values=("self.p95", "self.p99")),
        Rule(_ordered("p50", "p99"), "p50 must not exceed p99", values=("self.p50", "self.p99")),
    ),
    SLOSpec: (
        Rule("has(self.ttft) || has(self.tpot) || has(self.e2e)", "set at least one SLO target: ttft, tpot or e2e"),
    ),
    SpeculativeConfig: (
        Rule(_ordered("promptLookupMin", "promptLookupMax"), "promptLookupMin must not exceed promptLookupMax"),
        Rule("self.method != 'draft_model' || has(self.draftModel)", "method draft_model needs draftModel"),
    ),
    LengthDistribution: (
        Rule("self.p50 <= self.p99", "p99 must be at least p50"),
        Rule(_ordered("min", "max"), "min must not exceed max"),
    ),
    WorkloadSpec: (
        Rule(
            "self.profile != 'custom' || (has(self.promptTokens) && has(self.outputTokens))",
            "profile custom needs promptTokens and outputTokens",
        ),
        Rule(
            "!has(self.arrival) || self.arrival != 'concurrency' || has(self.concurrency)",
            "arrival concurrency needs concurrency (requests kept in flight)",
        ),
    ),
}


def rules_of(model: type[BaseModel]) -> tuple[Rule, ...]:
    if issubclass(model, ApiModel):
        return model.RULES
    return FOREIGN_RULES.get(model, ())
