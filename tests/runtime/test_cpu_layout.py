"""fp32 CPU weights stored column-major (gpu_runtime.model.cpu_layout) change only the storage: the engine's greedy
output and logits equal those of the row-major layout, ties hold, reloads and int8 quantization see the same values."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams, SchedulerKnobs
from gpu_runtime.model.cpu_layout import use_decode_layout
from gpu_runtime.model.loader import load_model
from gpu_runtime.quant.int8 import quantize_int8_per_channel

PROMPTS = [[5, 17, 42, 8, 99, 3], [200, 7, 7, 7, 31], list(range(40, 72))]


def _engine(path: Path, dtype: str = "float32") -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype=dtype, device="cpu",
                                  knobs=SchedulerKnobs(enable_prefix_caching=False)))


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def _row_major(model: nn.Module) -> None:
    with torch.no_grad():
        for module in _linears(model):
            module.weight.data = module.weight.data.contiguous()


def test_fp32_cpu_weights_load_column_major(tiny_llama_sharded: Path) -> None:
    model = load_model(tiny_llama_sharded, torch.float32, torch.device("cpu"))
    for module in _linears(model):
        assert module.weight.t().is_contiguous(), "a decode step streams [in, out] weights"
    assert use_decode_layout(model) == 0, "a second pass changes nothing"


def test_a_tied_head_stays_tied_and_the_embedding_reads_the_same_rows() -> None:
    model = nn.ModuleDict({"embed": nn.Embedding(50, 8), "head": nn.Linear(8, 50, bias=False)})
    model["head"].weight = model["embed"].weight
    ids = torch.tensor([0, 7, 49])
    rows = model["embed"](ids).detach().clone()
    assert use_decode_layout(model) == 1
    assert model["head"].weight is model["embed"].weight and model["embed"].weight.t().is_contiguous()
    torch.testing.assert_close(model["embed"](ids), rows, rtol=0, atol=0)


def test_bf16_weights_keep_the_row_major_layout(tiny_llama_sharded: Path) -> None:
    model = load_model(tiny_llama_sharded, torch.bfloat16, torch.device("cpu"))
    assert all(module.weight.is_contiguous() for module in _linears(model))


def test_greedy_output_and_logits_equal_the_row_major_layout(tiny_llama_sharded: Path) -> None:
    engine = _engine(tiny_llama_sharded)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    column_major = engine.generate(PROMPTS, params)
    hidden = torch.randn(4, engine.model_config.hidden_size)
    logits = engine.runner.model.compute_logits(hidden)
    _row_major(engine.runner.model)
    assert engine.generate(PROMPTS, params) == column_major
    torch.testing.assert_close(engine.runner.model.compute_logits(hidden), logits, rtol=1e-5, atol=1e-5)


def test_reload_and_int8_see_the_same_weights(tiny_llama_sharded: Path) -> None:
    engine = _engine(tiny_llama_sharded)
    weight = engine.runner.model.layers[0].mlp.down_proj.weight
    w_int8, scale = quantize_int8_per_channel(weight)
    assert w_int8.is_contiguous()
    expected_int8, expected_scale = quantize_int8_per_channel(weight.contiguous())
    assert torch.equal(w_int8, expected_int8) and torch.equal(scale, expected_scale)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    before = engine.generate(PROMPTS, params)
    engine.set_quantization("int8")
    engine.set_quantization("none")  # back through a reload of the checkpoint into fresh row-major shells
    assert engine.runner.model.layers[0].mlp.down_proj.weight.t().is_contiguous()
    assert engine.generate(PROMPTS, params) == before
