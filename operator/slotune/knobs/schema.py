"""The knob schema: every tunable knob declared once, with its type, bounds, default, flag and whether it is hot.

Everything that names or bounds a knob reads this table: `RuntimeConfig`'s fields and its flag renderer, the API's
`spec.tuning.bounds` ranges and the generated CRD, and (through `gpu_runtime/knob_schema.py`, generated from this
table by `slotune crd --write`) the builtin runtime's flag checks and its `/admin/config` model. A knob's name is at
once its `RuntimeConfig` field, its `spec.tuning.knobs` value and its `/admin/config` field (vLLM's flag name with
underscores); its flag is spelled as vLLM spells it (docs/facts.md#flags), so one renderer serves both engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Engine(StrEnum):
    """The serving engines slotune deploys; both take vLLM's flags and expose vLLM's metric names."""

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


class KnobKind(StrEnum):
    INT = "int"
    BOOL = "bool"  # rendered --flag / --no-flag (argparse's BooleanOptionalAction, as vLLM spells them)
    CHOICE = "choice"  # rendered --flag=value, left out at the default (so vLLM never sees quantization "none")
    JSON = "json"  # rendered --flag=JSON, left out when off


@dataclass(frozen=True)
class IntBounds:
    """An inclusive integer range a value must lie in."""

    minimum: int
    maximum: int

    def holds(self, value: int) -> bool:
        return self.minimum <= value <= self.maximum


@dataclass(frozen=True)
class KnobSpec:
    """One knob. `flag` None: not a runtime flag (replicas are the Deployment's). `hot`: the builtin runtime
    changes it in process through `POST /admin/config`; the other flagged knobs need a process restart."""

    name: str
    kind: KnobKind
    default: int | bool | str | None
    description: str
    flag: str | None
    hot: bool
    bounds: IntBounds | None = None  # INT knobs only
    choices: tuple[str, ...] = ()  # CHOICE knobs only
    changes_outputs: bool = False  # opt-in through spec.tuning.allowQualityChange

    def flags(self, value: object) -> list[str]:
        """This knob's part of a runtime's command line for `value` (a JSON-mode value, as model_dump gives)."""
        if self.flag is None or (self.kind is KnobKind.JSON and value is None):
            return []
        if self.kind is KnobKind.BOOL:
            return [self.flag if value else "--no-" + self.flag.removeprefix("--")]
        if self.kind is KnobKind.CHOICE and value == self.default:
            return []
        return [f"{self.flag}={value}"]


def _values(enum: type[StrEnum]) -> tuple[str, ...]:
    return tuple(member.value for member in enum)


# Limits of the speculative-decoding sub-knobs (SpeculativeConfig, spec.tuning.bounds, the runtime's admin body).
SPECULATIVE_TOKENS = IntBounds(1, 16)
PROMPT_LOOKUP = IntBounds(1, 16)

KNOBS: tuple[KnobSpec, ...] = (
    KnobSpec("max_num_seqs", KnobKind.INT, 256, "Most sequences running in one step.", "--max-num-seqs", hot=True,
             bounds=IntBounds(1, 4096)),
    # 16 tokens: at least one KV block's worth, so a step can always make progress on a prompt.
    KnobSpec("max_num_batched_tokens", KnobKind.INT, 2048, "Token budget of one engine step (prefill chunks + "
             "decodes).", "--max-num-batched-tokens", hot=True, bounds=IntBounds(16, 262144)),
    KnobSpec("enable_chunked_prefill", KnobKind.BOOL, True, "Split long prompts across steps.",
             "--enable-chunked-prefill", hot=True),
    KnobSpec("enable_prefix_caching", KnobKind.BOOL, True, "Reuse KV blocks of shared prompt prefixes.",
             "--enable-prefix-caching", hot=True),
    KnobSpec("speculative", KnobKind.JSON, None, "Speculative decoding; null is off.", "--speculative-config",
             hot=True),
    KnobSpec("quantization", KnobKind.CHOICE, Quantization.NONE, "Weight quantization (changes outputs).",
             "--quantization", hot=True, choices=_values(Quantization), changes_outputs=True),
    KnobSpec("kv_cache_dtype", KnobKind.CHOICE, KVCacheDtype.AUTO, "KV cache element type; fp8 needs the "
             "vllm engine (changes outputs).", "--kv-cache-dtype", hot=False, choices=_values(KVCacheDtype),
             changes_outputs=True),
    KnobSpec("replicas", KnobKind.INT, 1, "Runtime replicas serving the model.", None, hot=False,
             bounds=IntBounds(0, 1024)),
)

KNOBS_BY_NAME: dict[str, KnobSpec] = {k.name: k for k in KNOBS}
HOT_KNOBS = frozenset(k.name for k in KNOBS if k.hot)
RESTART_KNOBS = frozenset(k.name for k in KNOBS if k.flag is not None and not k.hot)
QUALITY_KNOBS = frozenset(k.name for k in KNOBS if k.changes_outputs)


def knob(name: str) -> KnobSpec:
    return KNOBS_BY_NAME[name]


def int_bounds(name: str) -> IntBounds:
    bounds = knob(name).bounds
    assert bounds is not None, f"{name} is not an integer knob"
    return bounds
