"""Weight quantization: int8 accuracy against full precision, weight memory, fp8 refusal on CPU, live re-quantization.

The model is Hugging Face's LlamaForCausalLM loaded from the runtime's own tiny checkpoint, so these tests check the
quantized layers independently of the engine; tests/runtime/test_quant_engine.py covers the engine's switch.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from gpu_runtime.checkpoint import build_checkpoint
from gpu_runtime.quant import (
    Fp8Linear,
    Fp8UnsupportedError,
    Int8Linear,
    QuantScheme,
    parse_scheme,
    quantize_model,
    requantize,
    weight_bytes,
)
from gpu_runtime.quant.fp8 import quantize_fp8_per_channel

NUM_PROMPTS = 200
PROMPT_LEN = 16
# Stated bound: int8 weight-only keeps each prompt's next-token logits within 1% (relative L2) of full precision.
MAX_LOGIT_REL_ERROR = 0.01
MIN_TOP1_AGREEMENT = 0.99
MAX_WEIGHT_RATIO = 0.55


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("quant") / "tiny", preset="tiny")


def _load(path: Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(path, torch_dtype=dtype).eval()


def _last_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[:, -1].float()  # [B, V]


def _prompts(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (NUM_PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(0))


def test_int8_logits_stay_close_and_agree_on_top1(checkpoint: Path) -> None:
    full = _load(checkpoint)
    quant = copy.deepcopy(full)
    report = quantize_model(quant, "int8")
    ids = _prompts(full.config.vocab_size)
    ref, got = _last_logits(full, ids), _last_logits(quant, ids)
    rel_error = (got - ref).norm(dim=-1) / ref.norm(dim=-1)  # [B]
    assert rel_error.max().item() < MAX_LOGIT_REL_ERROR
    assert rel_error.min().item() > 0  # the weights really changed
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= MIN_TOP1_AGREEMENT
    assert report.num_modules_quantized == 7 * full.config.num_hidden_layers
    assert report.weight_bytes_after <= MAX_WEIGHT_RATIO * report.weight_bytes_before


def test_bf16_weight_memory_with_embeddings_quantized(checkpoint: Path) -> None:
    model = _load(checkpoint, torch.bfloat16)
    default = quantize_model(copy.deepcopy(model), "int8")
    full = quantize_model(model, "int8", quantize_embeddings=True)
    assert full.weight_bytes_after <= MAX_WEIGHT_RATIO * full.weight_bytes_before
    assert full.weight_bytes_after < default.weight_bytes_after < default.weight_bytes_before
    assert isinstance(model.lm_head, Int8Linear)
    ids = _prompts(model.config.vocab_size)[:8]
    assert torch.isfinite(_last_logits(model, ids)).all()


def test_int8_linear_matches_the_dequantized_weight() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=True)
    q = Int8Linear.from_linear(linear)
    dequant = q.weight_int8.float() * q.scale[:, None].float()
    assert (dequant - linear.weight).abs().max() <= q.scale.max() / 2 + 1e-7  # rounding to the nearest step
    x = torch.randn(2, 5, 64)  # [B, S, in]
    expected = torch.nn.functional.linear(x, dequant, linear.bias)
    # CPU path rounds activations to bf16 (2**-8 relative) for the fused int8 kernel.
    torch.testing.assert_close(q(x), expected, rtol=0, atol=2e-2 * expected.abs().max().item())
    assert q(x).shape == (2, 5, 96)


def test_tied_embeddings_stay_shared_and_are_quantized_once() -> None:
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    untouched = quantize_model(copy.deepcopy(model), "int8")
    assert untouched.weight_bytes_after <= MAX_WEIGHT_RATIO * untouched.weight_bytes_before
    report = quantize_model(model, "int8", quantize_embeddings=True)
    assert model.lm_head.weight_int8 is model.model.embed_tokens.weight_q
    assert report.weight_bytes_after < untouched.weight_bytes_after


def test_fp8_quantization_error_and_forward_math() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    w_fp8, scale = quantize_fp8_per_channel(linear.weight)
    dequant = w_fp8.float() * scale[:, None]
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2**-4 for normal values; tiny ones round absolutely.
    bound = linear.weight.abs() * 2**-4 + scale[:, None] * 2**-9
    assert ((dequant - linear.weight).abs() <= bound).all()
    layer = Fp8Linear(w_fp8, scale, None, torch.float32)  # constructor does not check the device: math runs anywhere
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), x @ dequant.T)


def test_fp8_is_refused_on_cpu_with_a_clear_reason(checkpoint: Path) -> None:
    model = _load(checkpoint)
    before = weight_bytes(model)
    with pytest.raises(Fp8UnsupportedError, match="CUDA"):
        quantize_model(model, "fp8")
    with pytest.raises(Fp8UnsupportedError, match="int8"):
        Fp8Linear.from_linear(torch.nn.Linear(4, 4))
    assert weight_bytes(model) == before  # nothing was swapped


def test_requantize_switches_schemes_from_the_checkpoint(checkpoint: Path) -> None:
    original = load_file(str(checkpoint / "model.safetensors"))

    def reload(model: torch.nn.Module) -> None:
        model.load_state_dict(original, strict=False)

    model = _load(checkpoint)
    ids = _prompts(model.config.vocab_size)[:16]
    ref = _last_logits(model, ids)
    once = copy.deepcopy(model)
    quantize_model(once, "int8")
    to_int8 = requantize(model, "int8", reload)
    again = requantize(model, "int8", reload)  # int8 -> int8 starts over from the checkpoint, no double rounding
    assert torch.equal(_last_logits(model, ids), _last_logits(once, ids))
    assert again.weight_bytes_before == again.weight_bytes_after == to_int8.weight_bytes_after
    back = requantize(model, QuantScheme.NONE, reload)
    assert back.weight_bytes_after == to_int8.weight_bytes_before
    assert torch.equal(_last_logits(model, ids), ref)


@pytest.mark.parametrize(("text", "scheme"), [(None, "none"), ("INT8", "int8"), (" fp8 ", "fp8")])
def test_parse_scheme(text: str | None, scheme: str) -> None:
    assert parse_scheme(text) is QuantScheme(scheme)


def test_parse_scheme_refuses_unknown_schemes() -> None:
    with pytest.raises(ValueError, match="choose one of: none, int8, fp8"):
        parse_scheme("awq")
