"""The tunable knobs of a serving runtime and how each engine spells them.

`RuntimeConfig` is the one vocabulary the tuner, the operator, the local backend and the status share. The builtin
runtime (`gpu_runtime`) takes vLLM's flag names, so one renderer serves both engines; `admin_payload` is the body of
the builtin runtime's `POST /admin/config` for the knobs it can change live.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class Engine(StrEnum):
    BUILTIN = "builtin"
    VLLM = "vllm"


class SpeculativeMethod(StrEnum):
    NGRAM = "ngram"
    DRAFT_MODEL = "draft_model"


class Quantization(StrEnum):
    NONE = "none"
    INT8 = "int8"
    FP8 = "fp8"


class KVCacheDtype(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, use_enum_values=False
    )


class SpeculativeConfig(_Frozen):
    """Speculative decoding: draft tokens cheaply, verify them all in one target forward pass."""

    method: SpeculativeMethod = Field(description="ngram drafts by prompt lookup; draft_model runs a smaller model.")
    num_speculative_tokens: int = Field(default=4, ge=1, le=16, description="Tokens drafted per step.")
    prompt_lookup_min: int = Field(default=1, ge=1, le=16, description="Shortest n-gram matched (ngram only).")
    prompt_lookup_max: int = Field(default=4, ge=1, le=16, description="Longest n-gram matched (ngram only).")
    draft_model: str | None = Field(default=None, description="Draft checkpoint (draft_model only).")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("promptLookupMin must not exceed promptLookupMax")
        if self.method is SpeculativeMethod.DRAFT_MODEL and not self.draft_model:
            raise ValueError("method draft_model needs draftModel")
        return self

    def vllm_json(self) -> str:
        """The value of vLLM's `--speculative-config` (reference.md section 2)."""
        body: dict[str, object] = {"method": self.method.value, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method is SpeculativeMethod.NGRAM:
            body |= {"prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min}
        else:
            body["model"] = self.draft_model
        return json.dumps(body, separators=(",", ":"), sort_keys=True)


class RuntimeConfig(_Frozen):
    """One point in the knob space. Frozen: a change is a new config, so history and rollback stay exact."""

    max_num_seqs: int = Field(default=256, ge=1, le=4096, description="Most sequences running in one step.")
    max_num_batched_tokens: int = Field(
        default=2048, ge=16, le=262144, description="Token budget of one engine step (prefill chunks + decodes)."
    )
    enable_chunked_prefill: bool = Field(default=True, description="Split long prompts across steps.")
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV blocks of shared prompt prefixes.")
    speculative: SpeculativeConfig | None = Field(default=None, description="Speculative decoding; null is off.")
    quantization: Quantization = Field(default=Quantization.NONE, description="Weight quantization (changes outputs).")
    kv_cache_dtype: KVCacheDtype = Field(default=KVCacheDtype.AUTO, description="KV cache element type.")
    replicas: int = Field(default=1, ge=0, le=1024, description="Runtime replicas serving the model.")

    # Knobs the builtin runtime changes in process through /admin/config; the rest need a restart.
    HOT_KNOBS: ClassVar[frozenset[str]] = frozenset(
        {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
         "speculative", "quantization"}
    )

    def with_changes(self, **changes: object) -> RuntimeConfig:
        """A validated copy with some knobs changed (model_copy alone would skip validation)."""
        return RuntimeConfig.model_validate(self.model_dump() | changes)

    def changed_knobs(self, other: RuntimeConfig) -> frozenset[str]:
        mine, theirs = self.model_dump(), other.model_dump()
        return frozenset(k for k in mine if mine[k] != theirs[k])

    def needs_restart(self, other: RuntimeConfig) -> bool:
        """Whether moving from self to other needs a process restart on the builtin engine (replicas never do)."""
        return bool(self.changed_knobs(other) - self.HOT_KNOBS - {"replicas"})

    def key(self) -> str:
        """Stable identity of the per-replica engine config, for 'never try this config again' bookkeeping."""
        body = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def engine_args(self, engine: Engine = Engine.BUILTIN) -> list[str]:
        """Command-line flags for one runtime process. Builtin and vLLM share vLLM's spelling (reference.md s.2)."""
        args = [
            f"--max-num-seqs={self.max_num_seqs}",
            f"--max-num-batched-tokens={self.max_num_batched_tokens}",
            "--enable-chunked-prefill" if self.enable_chunked_prefill else "--no-enable-chunked-prefill",
            "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
        ]
        if self.speculative is not None:
            args.append(f"--speculative-config={self.speculative.vllm_json()}")
        if self.quantization is not Quantization.NONE:
            args.append(f"--quantization={self.quantization.value}")
        if self.kv_cache_dtype is not KVCacheDtype.AUTO or engine is Engine.VLLM:
            args.append(f"--kv-cache-dtype={self.kv_cache_dtype.value}")
        return args

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
