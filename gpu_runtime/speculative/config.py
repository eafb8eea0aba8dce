"""Speculative decoding settings, parsed from vLLM's `--speculative-config` JSON (docs/facts.md#flags).

Accepts the vLLM spelling (`{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":1}`,
`{"method":"draft_model","model":"...","num_speculative_tokens":5}`) and the snake_case body the operator's
`RuntimeConfig.admin_payload` sends (`draft_model` instead of `model`, null fields allowed). Unknown keys and methods
are refused with a message that names them, so a typo never silently turns speculation off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

MAX_SPECULATIVE_TOKENS = 16


class SpecMethod(StrEnum):
    NGRAM = "ngram"
    DRAFT_MODEL = "draft_model"


_KNOWN_KEYS = frozenset(
    {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model", "draft_model"}
)


@dataclass(frozen=True)
class SpeculativeSettings:
    """What to draft and how much; validated on construction."""

    method: SpecMethod
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1  # shortest n-gram matched against the context (ngram only)
    prompt_lookup_max: int = 4  # longest n-gram tried first (ngram only)
    draft_model: str | None = None  # checkpoint dir of the draft (draft_model only)

    def __post_init__(self) -> None:
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, "
                             f"got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")
        if self.method is SpecMethod.DRAFT_MODEL and not self.draft_model:
            raise ValueError('method "draft_model" needs "model": the draft checkpoint directory')

    def to_vllm_json(self) -> str:
        body: dict[str, object] = {"method": self.method.value, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method is SpecMethod.NGRAM:
            body |= {"prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min}
        else:
            body["model"] = self.draft_model
        return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _method(body: Mapping[str, object]) -> SpecMethod:
    raw = body.get("method")
    if raw is None:
        # vLLM infers the method from the model when none is given; "[ngram]" is its legacy ngram spelling.
        model = body.get("model") or body.get("draft_model")
        if model is None:
            raise ValueError('speculative config needs "method" ("ngram" or "draft_model")')
        return SpecMethod.NGRAM if model == "[ngram]" else SpecMethod.DRAFT_MODEL
    try:
        return SpecMethod(str(raw))
    except ValueError:
        message = f'unsupported speculative method {raw!r}; this runtime has "ngram" and "draft_model"'
        raise ValueError(message) from None


def _int_field(body: Mapping[str, object], key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"speculative config {key} must be an integer, got {value!r}")
    return value


def parse_speculative_config(value: str | Mapping[str, object] | None) -> SpeculativeSettings | None:
    """JSON text or a decoded mapping -> settings; None, "", "null" and {} mean speculation off."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip() or value.strip() == "null":
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not valid JSON: {exc}") from None
        if value is None:
            return None
    if not isinstance(value, Mapping):
        raise ValueError(f"speculative config must be a JSON object, got {type(value).__name__}")
    if not value:
        return None
    unknown = sorted(set(value) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"unknown speculative config keys {unknown}; known: {sorted(_KNOWN_KEYS)}")
    method = _method(value)
    lookup_max = _int_field(value, "prompt_lookup_max", 4)
    lookup_min = _int_field(value, "prompt_lookup_min", 1)
    draft = value.get("model") or value.get("draft_model")
    return SpeculativeSettings(
        method=method,
        num_speculative_tokens=_int_field(value, "num_speculative_tokens", 4),
        prompt_lookup_min=lookup_min,
        prompt_lookup_max=lookup_max,
        draft_model=None if method is SpecMethod.NGRAM or draft is None else str(draft),
    )
