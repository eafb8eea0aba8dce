"""`spec.quality` of a TunedModel: the quality gate every output-altering change passes before it is kept.

Before a change that can alter the model's outputs (weight quantization, an fp8 KV cache, speculative decoding), the
loop records the running config's greedy answers and logprobs on a fixed probe set (`slotune.quality`); after it,
the candidate's. A candidate is kept only if every bound here holds, and rolled back like a latency regression if
one breaks. The measures are defined in `slotune.quality.compare`. Defaults let 8-bit weights through on the
models measured (SmolLM2-135M: int8 vs fp32 mean KL 0.0024 nats, top-1 agreement 0.96, token agreement 0.56 at 32
tokens; bf16 vs fp32 alike) and refuse a change that moves the next-token distribution ten times as far.
"""

from __future__ import annotations

from pydantic import Field

from slotune.api.rules import ApiModel


class QualitySpec(ApiModel):
    """Bounds on how far a change may move the model's outputs, measured on a fixed probe set of chat prompts."""

    enabled: bool = Field(
        default=True, description="Measure every change that can alter outputs on the probe set and roll back one "
        "that breaks a bound below; false judges such changes on latency alone.",
    )
    min_token_agreement: float = Field(
        default=0.3, ge=0, le=1, description="Least share of greedy answer tokens that must come out as before the "
        "change (up to each answer's first differing token). Rounding alone makes greedy answers part after some "
        "tens of tokens, so this bound catches answers that break early.",
    )
    min_top1_agreement: float = Field(
        default=0.9, ge=0, le=1, description="Least share of positions, where both configs saw the same text, whose "
        "most likely next token is the same.",
    )
    max_mean_kl: float = Field(
        default=0.02, ge=0, le=10, description="Largest mean KL divergence (nats) of the next-token distribution, "
        "reference to candidate, over the positions where both saw the same text (from top_logprobs).",
    )
    probe_max_tokens: int = Field(
        default=32, ge=4, le=256, description="Tokens generated per probe prompt; longer probes judge more but take "
        "longer before and after each such change.",
    )
