"""One Rule, two enforcers: the CEL entry and the Python message come from the same fields."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from slotune.api import IntRange, KnobBounds, TunedModelSpec
from slotune.api.rules import Rule, wire_name


@pytest.mark.parametrize(("python", "wire"), [
    ("max_num_seqs", "maxNumSeqs"), ("window_s", "windowSeconds"), ("e2e", "e2e"),
    ("generation_tokens_per_s", "generationTokensPerSecond"), ("allow_quality_change", "allowQualityChange"),
])
def test_wire_names(python: str, wire: str) -> None:
    assert wire_name(python) == wire


def test_rule_with_values_gets_a_message_expression_and_python_says_the_same() -> None:
    rule = IntRange.RULES[0]
    entry = rule.schema()
    assert entry == {
        "rule": "self.min <= self.max", "message": "min must not exceed max",
        "messageExpression": "'min must not exceed max (min: %s, max: %s)'.format([self.min, self.max])",
        "fieldPath": ".min", "reason": "FieldValueInvalid",
    }
    bad = IntRange.model_construct(min=9, max=3)
    assert rule.explain(bad) == "min must not exceed max (min: 9, max: 3)"


def test_values_follow_wire_paths_through_nested_models() -> None:
    rule = next(r for r in TunedModelSpec.RULES if r.field_path == ".tuning.bounds.maxReplicas")
    spec = TunedModelSpec.model_validate({
        "model": {"name": "m", "source": "builtin://tiny"}, "hardware": {"accelerator": "cpu", "count": 0},
        "slo": {"tpot": {"p99": 40}}, "replicas": 2, "tuning": {"bounds": {"maxReplicas": 2}},
    })
    expected = "maxReplicas must be at least spec.replicas (tuning.bounds.maxReplicas: 2, replicas: 2)"
    assert rule.explain(spec) == expected


def test_doubles_print_like_cel_format() -> None:
    rule = Rule("true", "shown", values=("self.a",))

    class Holder(BaseModel):
        a: float

    assert [rule.explain(Holder(a=v)) for v in (600.0, 0.05, 812.5)] == [
        "shown (a: 600)", "shown (a: 0.05)", "shown (a: 812.5)"]


def test_rules_without_values_keep_a_plain_message() -> None:
    entry = KnobBounds.RULES[0].schema()
    plain = Rule("has(self.x)", "set x").schema()
    assert "messageExpression" in entry and plain == {"rule": "has(self.x)", "message": "set x"}


def test_a_quote_in_a_message_with_values_is_a_programming_error() -> None:
    with pytest.raises(AssertionError):
        Rule("true", "don't", values=("self.a",)).schema()
