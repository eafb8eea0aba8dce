"""The tunable knobs of a serving runtime: the schema that declares each knob once, and `RuntimeConfig`.

Import from here: `from slotune.knobs import RuntimeConfig, SpeculativeConfig, Engine, KNOBS`.
"""

from slotune.knobs.config import RuntimeConfig, SpeculativeConfig
from slotune.knobs.schema import (
    HOT_KNOBS,
    KNOBS,
    PROMPT_LOOKUP,
    QUALITY_KNOBS,
    RESTART_KNOBS,
    SPECULATIVE_TOKENS,
    Engine,
    IntBounds,
    KnobKind,
    KnobSpec,
    KVCacheDtype,
    Quantization,
    SpeculativeMethod,
    int_bounds,
    knob,
)

__all__ = [
    "HOT_KNOBS", "KNOBS", "PROMPT_LOOKUP", "QUALITY_KNOBS", "RESTART_KNOBS", "SPECULATIVE_TOKENS", "Engine",
    "IntBounds", "KVCacheDtype", "KnobKind", "KnobSpec", "Quantization", "RuntimeConfig", "SpeculativeConfig",
    "SpeculativeMethod", "int_bounds", "knob",
]
