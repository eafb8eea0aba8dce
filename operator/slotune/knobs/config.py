"""`RuntimeConfig`: one point in the knob space, the vocabulary the tuner, the operator, the local backend and the
status share.

Its fields, bounds, defaults and flag spellings come from the knob schema (`slotune.knobs.schema`), so the API, the
renderers and the runtime cannot disagree on them. The builtin runtime (`gpu_runtime`) takes vLLM's flag names, so
one renderer serves both engines; `admin_payload` is the body of the builtin runtime's `POST /admin/config` for the
knobs it can change live.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from slotune.knobs.schema import (
    HOT_KNOBS,
    KNOBS,
    PROMPT_LOOKUP,
    RESTART_KNOBS,
    SPECULATIVE_TOKENS,
    IntBounds,
    KVCacheDtype,
    Quantization,
    SpeculativeMethod,
    knob,
)


def knob_field(name: str) -> Any:
    """The pydantic field of a knob: its schema default, bounds and description."""
    spec = knob(name)
    if spec.bounds is None:
        return Field(default=spec.default, description=spec.description)
    return _within(spec.bounds, spec.default, spec.description)


def _within(bounds: IntBounds, default: Any, description: str) -> Any:
    return Field(default=default, ge=bounds.minimum, le=bounds.maximum, description=description)


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, use_enum_values=False
    )


class SpeculativeConfig(_Frozen):
    """Speculative decoding: draft tokens cheaply, verify them all in one target forward pass."""

    method: SpeculativeMethod = Field(description="ngram drafts by prompt lookup; draft_model runs a smaller model.")
    num_speculative_tokens: int = _within(SPECULATIVE_TOKENS, 4, "Tokens drafted per step.")
    prompt_lookup_min: int = _within(PROMPT_LOOKUP, 1, "Shortest n-gram matched (ngram only).")
    prompt_lookup_max: int = _within(PROMPT_LOOKUP, 4, "Longest n-gram matched (ngram only).")
    draft_model: str | None = Field(default=None, description="Draft checkpoint (draft_model only).")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("promptLookupMin must not exceed promptLookupMax")
        if self.method is SpeculativeMethod.DRAFT_MODEL and not self.draft_model:
            raise ValueError("method draft_model needs draftModel")
        return self

    def vllm_json(self) -> str:
        """The value of vLLM's `--speculative-config` (docs/facts.md#flags)."""
        body: dict[str, object] = {"method": self.method.value, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method is SpeculativeMethod.NGRAM:
            body |= {"prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min}
        else:
            body["model"] = self.draft_model
        return json.dumps(body, separators=(",", ":"), sort_keys=True)


class RuntimeConfig(_Frozen):
    """One point in the knob space. Frozen: a change is a new config, so history and rollback stay exact."""

    max_num_seqs: int = knob_field("max_num_seqs")
    max_num_batched_tokens: int = knob_field("max_num_batched_tokens")
    enable_chunked_prefill: bool = knob_field("enable_chunked_prefill")
    enable_prefix_caching: bool = knob_field("enable_prefix_caching")
    speculative: SpeculativeConfig | None = knob_field("speculative")
    quantization: Quantization = knob_field("quantization")
    kv_cache_dtype: KVCacheDtype = knob_field("kv_cache_dtype")
    replicas: int = knob_field("replicas")

    # Knobs the builtin runtime changes in process through /admin/config; the rest need a restart.
    HOT_KNOBS: ClassVar[frozenset[str]] = HOT_KNOBS

    def with_changes(self, **changes: object) -> RuntimeConfig:
        """A validated copy with some knobs changed (model_copy alone would skip validation)."""
        return RuntimeConfig.model_validate(self.model_dump() | changes)

    def changed_knobs(self, other: RuntimeConfig) -> frozenset[str]:
        mine, theirs = self.model_dump(), other.model_dump()
        return frozenset(k for k in mine if mine[k] != theirs[k])

    def needs_restart(self, other: RuntimeConfig) -> bool:
        """Whether moving from self to other needs a process restart on the builtin engine (replicas never do)."""
        return bool(self.changed_knobs(other) & RESTART_KNOBS)

    def key(self) -> str:
        """Stable identity of the per-replica engine config, for 'never try this config again' bookkeeping."""
        body = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def engine_args(self) -> list[str]:
        """Command-line flags for one runtime process, in schema order. Builtin and vLLM share vLLM's spelling
        (docs/facts.md#flags); a choice knob at its default is left out, so each engine keeps its own default."""
        values = self.model_dump(mode="json")
        values["speculative"] = None if self.speculative is None else self.speculative.vllm_json()
        return [flag for spec in KNOBS for flag in spec.flags(values[spec.name])]

    def admin_payload(self) -> dict[str, object]:
        """Body of the builtin runtime's POST /admin/config: the hot knobs, snake_case as the flags' dest names."""
        return self.model_dump(mode="json", include=set(self.HOT_KNOBS))

    def describe(self) -> str:
        """One line for logs, events and the terminal view."""
        spec = "off"
        if self.speculative is not None:
            spec = f"{self.speculative.method.value}x{self.speculative.num_speculative_tokens}"
        return (
            f"seqs={self.max_num_seqs} tokens={self.max_num_batched_tokens} "
            f"chunked={'on' if self.enable_chunked_prefill else 'off'} "
            f"prefix={'on' if self.enable_prefix_caching else 'off'} spec={spec} "
            f"quant={self.quantization.value} replicas={self.replicas}"
        )
