"""`spec.tuning` of a TunedModel: which knobs slotune may change, within what bounds, and how it measures.

Knob names are `RuntimeConfig`'s field names (vLLM's flag names with underscores), so a tuner compares
`RuntimeConfig.changed_knobs()` against `TuningSpec.knobs` directly. Every bound here is the knob schema's
(`slotune.knobs.schema`): a range the user writes for a knob can only narrow what the runtime accepts, never widen it.
Quantization and an fp8 KV cache change the model's outputs: they are opt-in through `allowQualityChange`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, create_model, field_validator

from slotune.api.rules import ApiModel, Rule
from slotune.knobs import KNOBS, SPECULATIVE_TOKENS, IntBounds, SpeculativeMethod, int_bounds
from slotune.knobs import QUALITY_KNOBS as QUALITY_KNOB_NAMES


class TuningMode(StrEnum):
    ONLINE = "online"
    BENCHMARK = "benchmark"
    OFF = "off"


class Knob(StrEnum):
    MAX_NUM_SEQS = "max_num_seqs"
    MAX_NUM_BATCHED_TOKENS = "max_num_batched_tokens"
    ENABLE_CHUNKED_PREFILL = "enable_chunked_prefill"
    ENABLE_PREFIX_CACHING = "enable_prefix_caching"
    SPECULATIVE = "speculative"
    QUANTIZATION = "quantization"
    KV_CACHE_DTYPE = "kv_cache_dtype"
    REPLICAS = "replicas"


# The enum spells the schema's knobs for static use; a knob added to the schema and not here fails at import.
if {k.value for k in Knob} != {k.name for k in KNOBS}:
    raise ImportError("Knob must list exactly the knobs of slotune.knobs.schema.KNOBS")
QUALITY_KNOBS = frozenset(Knob(name) for name in QUALITY_KNOB_NAMES)
DEFAULT_KNOBS = (
    Knob.MAX_NUM_SEQS, Knob.MAX_NUM_BATCHED_TOKENS, Knob.ENABLE_CHUNKED_PREFILL, Knob.ENABLE_PREFIX_CACHING,
    Knob.SPECULATIVE, Knob.REPLICAS,
)


class IntRange(ApiModel):
    """An inclusive integer range."""

    min: int = Field(description="Smallest value the tuner may set.")
    max: int = Field(description="Largest value the tuner may set.")

    RULES = (
        Rule("self.min <= self.max", "min must not exceed max", ".min", lambda r: r.min <= r.max,
             ("self.min", "self.max")),
    )


def range_within(name: str, bounds: IntBounds) -> type[IntRange]:
    """An IntRange whose ends must lie within `bounds` (a knob's schema bounds), named `name` in the CRD."""
    ends = {end: (int, Field(ge=bounds.minimum, le=bounds.maximum, description=info.description))
            for end, info in IntRange.model_fields.items()}
    return create_model(name, __base__=IntRange, __doc__=f"{IntRange.__doc__} Both ends lie in "
                        f"[{bounds.minimum}, {bounds.maximum}].", **ends)  # type: ignore[call-overload]


MaxNumSeqsRange = range_within("MaxNumSeqsRange", int_bounds(Knob.MAX_NUM_SEQS))
MaxNumBatchedTokensRange = range_within("MaxNumBatchedTokensRange", int_bounds(Knob.MAX_NUM_BATCHED_TOKENS))
SpeculativeTokensRange = range_within("SpeculativeTokensRange", SPECULATIVE_TOKENS)
REPLICAS = int_bounds(Knob.REPLICAS)


class KnobBounds(ApiModel):
    """Limits of the values the tuner may give each knob."""

    max_num_seqs: MaxNumSeqsRange = Field(
        default=MaxNumSeqsRange(min=1, max=1024), description="Range of maxNumSeqs (sequences running in one step)."
    )
    max_num_batched_tokens: MaxNumBatchedTokensRange = Field(
        default=MaxNumBatchedTokensRange(min=256, max=32768),
        description="Range of maxNumBatchedTokens (token budget of one step).",
    )
    min_replicas: int = Field(
        default=1, ge=1, le=REPLICAS.maximum, description="Fewest replicas the tuner may scale down to."
    )
    max_replicas: int | None = Field(
        default=None, ge=1, le=REPLICAS.maximum,
        description="Most replicas the tuner may scale up to; absent: spec.replicas.",
    )
    speculative_methods: list[SpeculativeMethod] = Field(
        default=[SpeculativeMethod.NGRAM], min_length=1, max_length=2,
        description="Speculative decoding methods the tuner may try: ngram, draft_model (needs model.draftModel).",
    )
    num_speculative_tokens: SpeculativeTokensRange = Field(
        default=SpeculativeTokensRange(min=1, max=8), description="Range of tokens drafted per speculative step."
    )

    RULES = (
        Rule("!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas", "minReplicas must not exceed "
             "maxReplicas", ".minReplicas", lambda b: b.max_replicas is None or b.min_replicas <= b.max_replicas,
             ("self.minReplicas", "self.maxReplicas")),
    )


class TuningSpec(ApiModel):
    """How slotune tunes: the mode, the knobs it may change, their bounds, and how it measures each change."""

    mode: TuningMode = Field(
        default=TuningMode.ONLINE,
        description="online tunes against live traffic; benchmark replays spec.workload; off only deploys and reports.",
    )
    knobs: list[Knob] = Field(
        default=list(DEFAULT_KNOBS), max_length=8, json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Knobs the tuner may change. quantization and kv_cache_dtype change outputs and need "
        "allowQualityChange.",
    )
    bounds: KnobBounds = Field(default=KnobBounds(), description="Limits of each knob's values.")
    allow_quality_change: bool = Field(
        default=False, description="Allow knobs that change model outputs (quantization, fp8 KV cache)."
    )
    window_s: float = Field(default=60, ge=5, le=3600, description="Length of one measurement window, in seconds.")
    min_samples: int = Field(
        default=200, ge=10, le=1000000, description="Fewest finished requests a window needs to be judged."
    )
    warmup_s: float = Field(
        default=30, ge=0, le=3600, description="Seconds ignored after a change before measuring (cold caches)."
    )
    cooldown_s: float = Field(default=10, ge=0, le=3600, description="Seconds waited between tuning iterations.")
    max_iterations: int = Field(default=20, ge=1, le=1000, description="Most changes tried before giving up.")
    convergence_windows: int = Field(
        default=2, ge=1, le=100, description="Consecutive windows meeting every SLO before the phase is Converged."
    )
    hot_reconfigure: bool = Field(
        default=True, description="Change knobs in the running process where the engine can, instead of restarting."
    )
    capacity_control: bool = Field(
        default=False, description="Size replicas every window from the measured arrival rate, its trend and the "
        "queue, a replica start-up ahead, judged by what they served (needs replicas in knobs and maxReplicas above "
        "minReplicas); off: replicas are one more searched knob, judged by latency before and after.",
    )

    RULES = (
        Rule("self.allowQualityChange || !self.knobs.exists(k, k == 'quantization' || k == 'kv_cache_dtype')",
             "quantization and kv_cache_dtype change model outputs: set allowQualityChange: true or remove them "
             "from knobs", ".knobs",
             lambda t: t.allow_quality_change or not QUALITY_KNOBS.intersection(t.knobs)),
    )

    @field_validator("knobs", mode="after")
    @classmethod
    def _unique(cls, knobs: list[Knob]) -> list[Knob]:
        repeated = sorted({k.value for k in knobs if knobs.count(k) > 1})
        if repeated:
            raise ValueError(f"knobs must not repeat: {', '.join(repeated)}")
        return knobs
