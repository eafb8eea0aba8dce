"""The capacity model the policy sizes steps with: replicas a load needs, and the batch a TPOT target allows."""

from __future__ import annotations

from slotune.knobs import RuntimeConfig
from slotune.perfmodel import Deployment
from slotune.perfmodel.capacity import Load, effective_batch, mean_step_s, replicas_needed

H100 = Deployment.from_names("llama-3.1-8b", "h100")
CHAT = Load(request_rate_per_s=20, mean_prompt_tokens=1000, mean_output_tokens=150)
# Long prompts with half of every prompt cacheable, at a rate that keeps a replica prefilling most of the time.
PROMPT_HEAVY = Load(request_rate_per_s=75, mean_prompt_tokens=1925, mean_output_tokens=148, cached_prompt_share=0.48)


def test_more_load_needs_more_replicas_and_a_larger_batch_fewer():
    config = RuntimeConfig(max_num_seqs=8)
    light = replicas_needed(H100, config, CHAT, 100)
    heavy = replicas_needed(H100, config, Load(80, 1000, 150), 100)
    assert 1 <= light < heavy
    assert replicas_needed(H100, config.with_changes(max_num_seqs=128), Load(80, 1000, 150), 100) < heavy


def test_a_tight_tpot_target_bounds_the_batch():
    config = RuntimeConfig(max_num_seqs=1024, max_num_batched_tokens=512)
    loose, tight = effective_batch(H100, config, CHAT, 200), effective_batch(H100, config, CHAT, 12)
    assert tight < loose
    assert mean_step_s(H100, config, CHAT, tight) * 1000 <= 12


def test_prefill_chunks_above_the_tpot_target_do_not_shrink_the_batch_to_nothing():
    # Every step carries a 1024-token chunk, so the mean step exceeds 0.8 x 25 ms at any batch: shrinking the batch
    # cannot meet the target (the token budget can), and must not make the load look like it needs dozens of replicas
    # (it did: the batch fell to 4 and the model asked for 27 replicas where 3 serve it).
    config = RuntimeConfig(max_num_seqs=64, max_num_batched_tokens=1024, enable_prefix_caching=False, replicas=4)
    assert mean_step_s(H100, config, PROMPT_HEAVY, 1) * 1000 > 0.8 * 25
    assert effective_batch(H100, config, PROMPT_HEAVY, 25) >= 32
    assert replicas_needed(H100, config, PROMPT_HEAVY, 25) <= 8
    cached = config.with_changes(enable_prefix_caching=True)
    assert replicas_needed(H100, cached, PROMPT_HEAVY, 25) < replicas_needed(H100, config, PROMPT_HEAVY, 25)
