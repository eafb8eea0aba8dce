"""Online calibration from measurement windows: how fast the engine actually steps against what the model predicts.

Each running sequence gets one token per engine step, so a window's mean inter-token latency is its mean step time.
The profile prices that window as a mix of two steps: a decode of the window's mean occupancy (running sequences per
replica at their mean context), and the same decode carrying a prefill chunk. The share of steps that carry a chunk
is measured (prompt tokens prefilled per second per replica, less prefix-cache hits, times the step, over the chunk
size), so measured = f * (decode + share * chunk extra) gives the slowdown f. Pricing the mean step alone would not
do: the roofline's max(memory, compute) is convex, and on simulated windows that read 1.1-1.4 on exact hardware.
f is one sample of how far the profile is from this hardware (datasheet efficiencies, another build, a noisy
neighbour); the loop keeps the recent ones and prices configurations with the profile slowed by their median
(`Deployment.slower`), so replicas, batch limits and floors are sized for the hardware measured.

Aggregates are not a step trace (`calibration.calibrate` fits those, and can tell bandwidth from compute): bursty
arrivals thin the time-averaged occupancy and read slow (up to 2x on the code workload). Windows with speculation are
skipped: a step then yields several tokens per sequence.
"""

from __future__ import annotations

from dataclasses import replace

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.deployment import Deployment
from slotune.perfmodel.roofline import StepShape
from slotune.snapshot import MetricsSnapshot

SPEED_RATIO_BOUNDS = (0.5, 4.0)  # beyond these the window, not the hardware, is the likelier explanation


def speed_ratio(deployment: Deployment, config: RuntimeConfig, snapshot: MetricsSnapshot) -> float | None:
    """How many times the profile's step time this window's steps took, or None where the window cannot tell."""
    latency = snapshot.itl if snapshot.itl.mean_ms else snapshot.tpot
    running = snapshot.num_running_mean or 0.0
    if config.speculative is not None or not latency.mean_ms or running < 1.0:
        return None
    measured_s = latency.mean_ms / 1000.0
    model = deployment.step_model(config)
    prompt = snapshot.mean_prompt_tokens or 0.0
    context = snapshot.mean_decode_context_tokens
    hit = (snapshot.prefix_cache_hit_rate or 0.0) if config.enable_prefix_caching else 0.0
    decode = StepShape(num_decode_seqs=running, decode_context_tokens=running * context)
    decode_s = model.step_time_s(decode)
    new_tokens = prompt * (1.0 - hit)  # prefilled per request
    prefill_per_s = snapshot.prompt_tokens_per_s / max(config.replicas, 1) * (1.0 - hit)
    if new_tokens < 1.0 or prefill_per_s <= 0.0:
        ratio = measured_s / decode_s
    else:
        chunk = _chunk_tokens(config, snapshot, running, new_tokens)
        # A new prompt token attends to the cached part of its prompt and, on average, half of the rest.
        with_chunk = replace(decode, num_prefill_tokens=chunk, num_prefill_seqs=1, num_new_seqs=1,
                             prefill_attention_tokens=chunk * prompt * (hit + (1.0 - hit) / 2),
                             prefill_context_pairs=chunk * prompt * hit)
        extra_s = model.step_time_s(with_chunk) - decode_s
        # measured = f * (decode_s + share * extra_s), share = min(1, measured * prefill_per_s / chunk)
        share = min(1.0, measured_s * prefill_per_s / chunk)
        ratio = measured_s / (decode_s + share * extra_s)
    low, high = SPEED_RATIO_BOUNDS
    return ratio if low <= ratio <= high else None


def _chunk_tokens(config: RuntimeConfig, snapshot: MetricsSnapshot, running: float, new_tokens: float) -> float:
    """Prompt tokens in a step that carries prefill: a whole prompt without chunked prefill; with it, what the token
    budget leaves beside the decodes, filled from the queue when requests wait, else one prompt at most."""
    if not config.enable_chunked_prefill:
        return new_tokens
    room = max(config.max_num_batched_tokens - running, 1.0)
    return room if (snapshot.num_waiting_mean or 0.0) >= 1.0 else min(room, new_tokens)
