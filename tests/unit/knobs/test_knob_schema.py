"""Each knob is declared once (slotune.knobs.schema) and every place that bounds or spells it agrees with that.

The places: `RuntimeConfig` and `SpeculativeConfig`, the API's `spec.tuning.bounds` ranges, the generated CRD, the
generated runtime schema file, the runtime's flag checks (`gpu_runtime.config`), its command line and its
`/admin/config` model. They agree by construction (each reads the schema); these tests keep it that way.
"""

from __future__ import annotations

from typing import Any

import pytest

from slotune.api import KnobBounds, TunedModelSpec
from slotune.api.schema import structural_schema
from slotune.knobs import (
    HOT_KNOBS,
    KNOBS,
    PROMPT_LOOKUP,
    SPECULATIVE_TOKENS,
    IntBounds,
    KnobKind,
    KnobSpec,
    RuntimeConfig,
    SpeculativeConfig,
    knob,
    runtime_file,
)

INT_KNOBS = [k for k in KNOBS if k.kind is KnobKind.INT]
CHOICE_KNOBS = [k for k in KNOBS if k.kind is KnobKind.CHOICE]
FLAGGED_KNOBS = [k for k in KNOBS if k.flag is not None]


def _bounds_of(schema: dict[str, Any]) -> IntBounds:
    return IntBounds(schema["minimum"], schema["maximum"])


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(p.capitalize() for p in rest)


def _crd_config() -> dict[str, Any]:
    return structural_schema(TunedModelSpec, nullable=False)["properties"]["runtime"]["properties"]["config"]


def test_runtime_config_has_exactly_the_schemas_knobs() -> None:
    assert list(RuntimeConfig.model_fields) == [k.name for k in KNOBS]
    assert RuntimeConfig.HOT_KNOBS == HOT_KNOBS
    assert set(RuntimeConfig().admin_payload()) == HOT_KNOBS


@pytest.mark.parametrize("spec", INT_KNOBS, ids=lambda k: k.name)
def test_int_knob_bounds_agree_in_config_and_crd(spec: KnobSpec) -> None:
    assert _bounds_of(RuntimeConfig.model_json_schema(by_alias=False)["properties"][spec.name]) == spec.bounds
    if spec.name != "replicas":  # spec.runtime.config leaves replicas to spec.replicas
        assert _bounds_of(_crd_config()["properties"][_camel(spec.name)]) == spec.bounds


@pytest.mark.parametrize("name", ["max_num_seqs", "max_num_batched_tokens"])
def test_tuning_bounds_cannot_widen_a_knob(name: str) -> None:
    """Both ends of spec.tuning.bounds.<knob> must lie within the knob's own bounds, so the tuner never proposes a
    value RuntimeConfig (or the runtime) would refuse."""
    range_model = KnobBounds.model_fields[name].annotation
    ends = range_model.model_json_schema()["properties"]  # type: ignore[union-attr]
    assert _bounds_of(ends["min"]) == _bounds_of(ends["max"]) == knob(name).bounds
    assert _bounds_of(KnobBounds.model_json_schema()["properties"]["maxReplicas"]["anyOf"][0]).maximum == \
        knob("replicas").bounds.maximum  # type: ignore[union-attr]


def test_speculative_sub_knob_bounds_agree() -> None:
    fields = SpeculativeConfig.model_json_schema()["properties"]
    assert _bounds_of(fields["numSpeculativeTokens"]) == SPECULATIVE_TOKENS
    assert _bounds_of(fields["promptLookupMin"]) == _bounds_of(fields["promptLookupMax"]) == PROMPT_LOOKUP
    tokens = KnobBounds.model_fields["num_speculative_tokens"].annotation.model_json_schema()  # type: ignore[union-attr]
    assert _bounds_of(tokens["properties"]["max"]) == SPECULATIVE_TOKENS


@pytest.mark.parametrize("spec", CHOICE_KNOBS, ids=lambda k: k.name)
def test_choice_knobs_agree_in_config_and_crd(spec: KnobSpec) -> None:
    assert tuple(_crd_config()["properties"][_camel(spec.name)]["enum"]) == spec.choices
    for value in spec.choices:
        assert getattr(RuntimeConfig.model_validate({spec.name: value}), spec.name) == value


def test_the_committed_runtime_schema_is_the_generated_one() -> None:
    assert runtime_file.PATH.read_text() == runtime_file.render(), "run `slotune crd --write`"


# The runtime's side, through its own modules (they read gpu_runtime/knob_schema.py, never slotune).

def test_the_runtime_reads_every_knob_as_declared() -> None:
    config = pytest.importorskip("gpu_runtime.config")
    for spec in KNOBS:
        row = config.KNOBS[spec.name]
        bounds = None if row.minimum is None else IntBounds(row.minimum, row.maximum)
        assert (row.kind, row.flag, row.hot, bounds, row.choices) == (
            spec.kind.value, spec.flag, spec.hot, spec.bounds, spec.choices)
    assert (SPECULATIVE_TOKENS.minimum, SPECULATIVE_TOKENS.maximum) == config.SPECULATIVE_TOKENS
    assert (PROMPT_LOOKUP.minimum, PROMPT_LOOKUP.maximum) == config.PROMPT_LOOKUP


@pytest.mark.parametrize("name", ["max_num_seqs", "max_num_batched_tokens"])
def test_the_runtimes_scheduler_knobs_take_exactly_the_bounds(name: str) -> None:
    config = pytest.importorskip("gpu_runtime.config")
    bounds = knob(name).bounds
    assert bounds is not None
    for value in (bounds.minimum, bounds.maximum):
        config.SchedulerKnobs(**{name: value})
    for value in (bounds.minimum - 1, bounds.maximum + 1):
        with pytest.raises(ValueError, match=name):
            config.SchedulerKnobs(**{name: value})


def test_the_admin_endpoint_takes_exactly_the_hot_knobs_and_their_bounds() -> None:
    admin = pytest.importorskip("gpu_runtime.server.admin")
    schema = admin.AdminConfig.model_json_schema()
    assert set(schema["properties"]) == HOT_KNOBS
    for spec in INT_KNOBS:
        if spec.hot:
            assert _bounds_of(schema["properties"][spec.name]) == spec.bounds
    body = schema["$defs"]["SpeculativeBody"]["properties"]
    assert _bounds_of(body["num_speculative_tokens"]) == SPECULATIVE_TOKENS
    assert _bounds_of(body["prompt_lookup_min"]) == _bounds_of(body["prompt_lookup_max"]) == PROMPT_LOOKUP
    live = RuntimeConfig(max_num_seqs=knob("max_num_seqs").bounds.maximum, quantization="int8")  # type: ignore[union-attr]
    admin.AdminConfig.model_validate(live.admin_payload())
    for spec in CHOICE_KNOBS:
        if spec.hot:
            with pytest.raises(ValueError, match=spec.name):
                admin.AdminConfig.model_validate(RuntimeConfig().admin_payload() | {spec.name: "bogus"})


def _everything_off_default() -> RuntimeConfig:
    return RuntimeConfig(max_num_seqs=7, max_num_batched_tokens=333, enable_chunked_prefill=False,
                         enable_prefix_caching=False, speculative=SpeculativeConfig(method="ngram"),
                         quantization="int8", kv_cache_dtype="fp8")


def test_engine_args_spell_every_flagged_knob_once() -> None:
    args = _everything_off_default().engine_args()
    for spec in FLAGGED_KNOBS:
        assert spec.flag is not None
        spelled = [a for a in args if a.split("=")[0] in (spec.flag, "--no-" + spec.flag.removeprefix("--"))]
        assert len(spelled) == 1, (spec.name, args)


def test_the_runtimes_command_line_parses_what_the_operator_renders() -> None:
    cli = pytest.importorskip("gpu_runtime.cli")
    config = _everything_off_default()
    args = cli.build_parser().parse_args(["serve", "--model", "/m", *config.engine_args()])
    for spec in FLAGGED_KNOBS:
        if spec.kind is not KnobKind.JSON:
            assert getattr(args, spec.name) == getattr(config, spec.name), spec.name
    for spec in CHOICE_KNOBS:
        assert spec.flag is not None
        for value in spec.choices:
            parsed = cli.build_parser().parse_args(["serve", "--model", "/m", f"{spec.flag}={value}"])
            assert getattr(parsed, spec.name) == value
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["serve", "--model", "/m", f"{spec.flag}=bogus"])
