"""What the engine hands back: one `RequestOutput` per request and step (new tokens, text, timestamps: the single
source of every latency metric), and `EngineStats`, the counters and gauges the server exports."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_runtime.engine.logprobs import TokenLogprob
from gpu_runtime.engine.sequence import RequestTimes


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_output_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool
    finish_reason: str | None
    times: RequestTimes
    token_times: list[float]
    logprobs: list[TokenLogprob] | None = None  # one per new token when the request asked for logprobs


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_total_blocks: int
    num_free_blocks: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    num_preemptions: int
    num_steps: int
    last_step_num_tokens: int
    # Speculative decoding (cumulative; vllm:spec_decode_*): verified drafts, drafted and accepted tokens, and how
    # often the draft token at each position was accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
