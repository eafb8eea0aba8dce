"""Roofline model: datasheet bounds from reference.md s.4, model sizes from public configs, calibration recovery."""

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
    # reference.md s.4: Llama-3.1-8B bf16 batch-1 TPOT lower bounds, weights / bandwidth.
    model = StepTimeModel(LLAMA_8B, accelerator(name), efficiency=IDEAL)
    assert model.decode_step_s(1, 0) * 1000 == pytest.approx(bound_ms, rel=0.08)


def test_decode_is_memory_bound_at_small_batch_and_compute_bound_past_the_ridge():
    model = StepTimeModel(LLAMA_8B, accelerator("h100"), efficiency=IDEAL)
    small = model.cost(StepShape(num_decode_seqs=8))
    large = model.cost(StepShape(num_decode_seqs=2048))
    assert small.memory_s > small.compute_s
    assert large.compute_s > large.memory_s
    ridge = accelerator("h100").ridge_tokens
    assert 250 < ridge < 340  # reference.md s.4: ~295 on H100


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
    # reference.md s.9: tiny fp32 model, 2 threads: 3.9 / 8.0 / 15.8 ms per decode step at batch 1 / 16 / 64.
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
