"""Roofline model: datasheet bounds from docs/facts.md#gpu, model sizes from public configs, calibration recovery."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from slotune.knobs import KVCacheDtype, Quantization
from slotune.perfmodel import (
    Efficiency,
    ModelProfile,
    StepMeasurement,
    StepShape,
    StepTimeModel,
    accelerator,
    calibrate,
    model_profile,
)
from slotune.perfmodel.calibration import step_trace_measurements

LLAMA_8B = model_profile("llama-3.1-8b")
IDEAL = Efficiency(bandwidth=1.0, compute=1.0, step_overhead_s=0.0, layer_overhead_s=0.0)


def test_llama_8b_from_hf_config_counts_8_billion_params(tmp_path):
    config = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    profile = ModelProfile.from_hf_config(path, name="llama")
    assert profile.num_params == pytest.approx(8.03e9, rel=0.01)
    assert profile.resident_bytes() == pytest.approx(16.06e9, rel=0.01)
    assert profile.weight_bytes() < profile.resident_bytes()  # the input embedding is gathered, not read
    assert profile.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2


@pytest.mark.parametrize(("name", "bound_ms"), [("h200", 3.2), ("h100", 4.6), ("a100-80gb", 7.6), ("l4", 52)])
def test_batch1_tpot_lower_bound_matches_reference(name, bound_ms):
    # docs/facts.md#gpu: Llama-3.1-8B bf16 batch-1 TPOT lower bounds, weights / bandwidth.
    model = StepTimeModel(LLAMA_8B, accelerator(name), efficiency=IDEAL)
    assert model.decode_step_s(1, 0) * 1000 == pytest.approx(bound_ms, rel=0.08)


def test_decode_is_memory_bound_at_small_batch_and_compute_bound_past_the_ridge():
    model = StepTimeModel(LLAMA_8B, accelerator("h100"), efficiency=IDEAL)
    small = model.cost(StepShape(num_decode_seqs=8))
    large = model.cost(StepShape(num_decode_seqs=2048))
    assert small.memory_s > small.compute_s
    assert large.compute_s > large.memory_s
    ridge = accelerator("h100").ridge_tokens
    assert 250 < ridge < 340  # docs/facts.md#gpu: ~295 on H100


def test_quantization_and_fp8_kv_shrink_bytes_and_speed_up_decode():
    base = StepTimeModel(LLAMA_8B, accelerator("l4"))
    quant = replace(base, quantization=Quantization.INT8)
    assert quant.decode_step_s(1, 1000) < 0.6 * base.decode_step_s(1, 1000)
    assert quant.kv_capacity_tokens() > base.kv_capacity_tokens()
    fp8_kv = replace(base, kv_cache_dtype=KVCacheDtype.FP8)
    assert fp8_kv.kv_capacity_tokens() == pytest.approx(2 * base.kv_capacity_tokens(), rel=0.01)


def test_prefill_grows_with_prompt_and_cached_prefix_saves_time():
    model = StepTimeModel(LLAMA_8B, accelerator("a100-40gb"))
    assert model.prefill_s(4000) > 3 * model.prefill_s(1000)
    assert model.prefill_s(2000, cached_tokens=1500) < 0.4 * model.prefill_s(2000)
    # Chunking costs a little extra (weights re-read per chunk) but never less work.
    assert model.prefill_s(4096, chunk_tokens=512) >= model.prefill_s(4096)


def test_tensor_parallel_halves_the_memory_bound_and_adds_communication():
    one = StepTimeModel(LLAMA_8B, accelerator("h100"), efficiency=IDEAL)
    two = replace(one, tensor_parallel=2)
    assert two.cost(StepShape(num_decode_seqs=1)).memory_s == pytest.approx(
        one.cost(StepShape(num_decode_seqs=1)).memory_s / 2)
    assert two.cost(StepShape(num_decode_seqs=1)).comm_s > 0


def test_unknown_accelerator_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="nvidia-l4"):
        accelerator("tpu-v9")


def _measure(model: StepTimeModel, rng: np.random.Generator, noise: float) -> list[StepMeasurement]:
    shapes = [StepShape(num_decode_seqs=b, decode_context_tokens=b * ctx) for b in (1, 4, 16, 64, 256, 1024)
              for ctx in (100, 2000)]
    shapes += [StepShape(num_prefill_tokens=n, prefill_attention_tokens=n * n / 2) for n in (256, 1024, 4096, 8192)]
    return [StepMeasurement(s, model.step_time_s(s) * (1 + rng.normal(0, noise))) for s in shapes]


def test_calibration_recovers_efficiencies_and_overhead_from_noisy_steps():
    truth = Efficiency(bandwidth=0.55, compute=0.4, step_overhead_s=0.003, layer_overhead_s=0.0)
    true_model = StepTimeModel(LLAMA_8B, accelerator("a100-80gb"), efficiency=truth)
    measured = _measure(true_model, np.random.default_rng(0), noise=0.02)
    result = calibrate(StepTimeModel(LLAMA_8B, accelerator("a100-80gb")), measured)
    assert result.efficiency.bandwidth == pytest.approx(0.55, rel=0.1)
    assert result.efficiency.compute == pytest.approx(0.4, rel=0.1)
    assert result.efficiency.step_overhead_s == pytest.approx(0.003, rel=0.3)
    assert result.rms_relative_error < 0.05


def test_calibration_brings_the_cpu_model_closer_to_the_reference_tiny_model_steps():
    # docs/facts.md#cpu: tiny fp32 model, 2 threads: 3.9 / 8.0 / 15.8 ms per decode step at batch 1 / 16 / 64.
    # Eager CPU steps grow almost linearly from batch 1 (per-op costs), which a max() roofline fits only roughly.
    tiny = StepTimeModel(model_profile("tiny"), accelerator("cpu"))
    measured = [StepMeasurement(StepShape(num_decode_seqs=b, decode_context_tokens=b * 64), t)
                for b, t in ((1, 0.0039), (16, 0.0080), (64, 0.0158))]
    prior_errors = [(tiny.step_time_s(m.shape) - m.step_time_s) / m.step_time_s for m in measured]
    prior_rms = float(np.sqrt(np.mean(np.square(prior_errors))))
    result = calibrate(tiny, measured)
    assert result.rms_relative_error < prior_rms
    assert result.rms_relative_error < 0.3


def test_calibration_needs_enough_measurements():
    with pytest.raises(ValueError, match="at least 3"):
        calibrate(StepTimeModel(LLAMA_8B, accelerator("cpu")), [])


def test_steps_that_all_read_the_same_bytes_keep_the_prior_bandwidth_and_fit_a_fixed_cost():
    # One model's decode steps all stream the same weights: fixed cost and 1/bandwidth cannot be told apart.
    tiny = StepTimeModel(model_profile("tiny"), accelerator("cpu"))
    measured = [StepMeasurement(StepShape(num_decode_seqs=b, decode_context_tokens=b * 288), t)
                for b, t in ((1, 0.0038), (4, 0.0066), (8, 0.0094))]
    result = calibrate(tiny, measured)
    assert result.efficiency.bandwidth == tiny.eff.bandwidth
    assert result.efficiency.step_overhead_s > 0.001  # the per-step cost an eager CPU runtime pays


HOST_TRUTH = Efficiency(bandwidth=0.6, compute=0.45, step_overhead_s=0.002, layer_overhead_s=0.0, seq_overhead_s=4e-4,
                        prefill_seq_overhead_s=5e-4, new_seq_overhead_s=1.5e-3, decode_context_token_s=1e-6,
                        prefill_attention_pair_s=1e-7, prefill_context_pair_s=3e-7)


def _mixed_steps(model: StepTimeModel, rng: np.random.Generator, noise: float) -> list[StepMeasurement]:
    """Steps of the shapes an engine runs under load: decodes of varied batch and context, fresh and continued
    prefill chunks (first or later chunks of a request), alone and mixed with decodes."""
    shapes = []
    for _ in range(300):
        batch, context = int(rng.integers(0, 17)), float(rng.integers(16, 900))
        chunk, cached = int(rng.choice([0, 0, 0, int(rng.integers(8, 600))])), int(rng.choice([0, 0, 256]))
        first = cached == 0 or bool(rng.integers(0, 2))  # after 256 tokens: a cache hit's first chunk, or a later one
        if batch == 0 and chunk == 0:
            chunk = 64
        shapes.append(StepShape(num_prefill_tokens=chunk, prefill_attention_tokens=chunk * (cached + chunk / 2),
                                num_decode_seqs=batch, decode_context_tokens=batch * context,
                                num_prefill_seqs=1 if chunk else 0, prefill_context_pairs=chunk * cached,
                                num_new_seqs=1 if chunk and first else 0))
    return [StepMeasurement(s, model.step_time_s(s) * (1 + rng.normal(0, noise))) for s in shapes]


def test_host_terms_are_zero_on_gpus_so_gpu_step_times_are_the_plain_roofline():
    for name in ("h100", "a100-80gb", "l4"):
        eff = Efficiency.prior(accelerator(name))
        assert (eff.seq_overhead_s, eff.prefill_seq_overhead_s, eff.new_seq_overhead_s, eff.decode_context_token_s,
                eff.prefill_attention_pair_s, eff.prefill_context_pair_s) == (0, 0, 0, 0, 0, 0)
    model = StepTimeModel(LLAMA_8B, accelerator("h100"))
    shape = StepShape(num_prefill_tokens=512, prefill_attention_tokens=512 * 256, num_decode_seqs=32,
                      decode_context_tokens=32 * 1000, prefill_context_pairs=0)
    cost, eff = model.cost(shape), model.eff
    assert model.step_time_s(shape) == pytest.approx(
        model.fixed_s() + max(cost.memory_s / eff.bandwidth, cost.compute_s / eff.compute))


def test_host_terms_add_per_sequence_per_context_token_and_per_pair_costs():
    model = StepTimeModel(model_profile("tiny"), accelerator("cpu"), efficiency=HOST_TRUTH)
    plain = replace(model, efficiency=replace(HOST_TRUTH, seq_overhead_s=0.0, prefill_seq_overhead_s=0.0,
                                              new_seq_overhead_s=0.0, decode_context_token_s=0.0,
                                              prefill_attention_pair_s=0.0, prefill_context_pair_s=0.0))
    extra = model.decode_step_s(8, 300) - plain.decode_step_s(8, 300)
    assert extra == pytest.approx(8 * (4e-4 + 300 * 1e-6))
    # 256 new tokens after 256 cached ones: a new request's one chunk, its pairs, its pairs with the cached context.
    extra = model.prefill_s(512, cached_tokens=256) - plain.prefill_s(512, cached_tokens=256)
    assert extra == pytest.approx(4e-4 + 5e-4 + 1.5e-3 + 256 * (256 + 128) * 1e-7 + 256 * 256 * 3e-7)
    # In two chunks the request starts once: the second chunk pays the chunk costs, not the new-request cost.
    extra = model.prefill_s(512, chunk_tokens=256) - plain.prefill_s(512, chunk_tokens=256)
    assert extra == pytest.approx(2 * (4e-4 + 5e-4) + 1.5e-3 + 256 * 128 * 1e-7 + 256 * 384 * 1e-7 + 256 * 256 * 3e-7)


def test_calibration_recovers_the_host_terms_from_mixed_steps():
    true_model = StepTimeModel(model_profile("tiny"), accelerator("cpu"), efficiency=HOST_TRUTH)
    measured = _mixed_steps(true_model, np.random.default_rng(1), noise=0.03)
    result = calibrate(StepTimeModel(model_profile("tiny"), accelerator("cpu")), measured)
    eff = result.efficiency
    assert eff.seq_overhead_s == pytest.approx(4e-4, rel=0.2)
    # Chunk costs are a few % of a prefill step, near the noise: their sum is what the steps pin down, and the
    # new-request share of it stays the larger one.
    assert eff.prefill_seq_overhead_s + eff.new_seq_overhead_s == pytest.approx(2e-3, rel=0.2)
    assert eff.new_seq_overhead_s > eff.prefill_seq_overhead_s
    assert eff.decode_context_token_s == pytest.approx(1e-6, rel=0.2)
    assert eff.prefill_context_pair_s == pytest.approx(3e-7, rel=0.2)
    assert eff.step_overhead_s == pytest.approx(0.002, rel=0.2)
    assert result.rms_relative_error < 0.05


def test_calibration_without_host_terms_keeps_the_priors_and_fits_worse():
    true_model = StepTimeModel(model_profile("tiny"), accelerator("cpu"), efficiency=HOST_TRUTH)
    measured = _mixed_steps(true_model, np.random.default_rng(2), noise=0.03)
    prior = StepTimeModel(model_profile("tiny"), accelerator("cpu"))
    plain = calibrate(prior, measured, fit_host_terms=False)
    full = calibrate(prior, measured)
    assert plain.efficiency.seq_overhead_s == 0 and plain.efficiency.decode_context_token_s == 0
    assert plain.rms_relative_error > 3 * full.rms_relative_error


def test_step_trace_lines_become_measurements_from_start_to_next_start():
    def line(start_s: float, end_s: float, prefill: int, decodes: int) -> str:
        return json.dumps({"start_s": start_s, "end_s": end_s, "num_prefill_tokens": prefill,
                           "num_prefill_seqs": 1 if prefill else 0, "prefill_attention_tokens": prefill * 40.0,
                           "prefill_context_pairs": prefill * 8, "num_decode_seqs": decodes,
                           "decode_context_tokens": decodes * 100, "max_decode_context_tokens": 100})

    lines = [line(0.0, 0.030, 64, 0), line(0.0302, 0.0340, 0, 1), line(0.5, 0.504, 0, 1), line(0.5041, 0.508, 0, 2)]
    measured = step_trace_measurements(lines)
    # The second step is followed by an idle wait, so its period is unknown and it is left out; so is the last.
    assert [round(m.step_time_s, 4) for m in measured] == [0.0302, 0.0041]
    first = measured[0].shape
    assert (first.num_prefill_tokens, first.num_prefill_seqs, first.prefill_context_pairs) == (64, 1, 512)
    assert measured[1].shape.decode_context_tokens == 100
