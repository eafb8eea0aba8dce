"""fp32 CPU linear layers through numpy's OpenBLAS (gpu_runtime.model.cpu_blas): the path is taken here (pinned to one
OpenBLAS thread), equals F.linear to fp32 rounding for one row (GEMV) and many (GEMM), leaves every other case to
F.linear bit for bit, and the engine's greedy output and logits are those of torch's kernel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams, SchedulerKnobs
from gpu_runtime.model import cpu_blas
from gpu_runtime.model.cpu_blas import BlasLinear
from gpu_runtime.model.cpu_layout import use_decode_layout

PROMPTS = [[5, 17, 42, 8, 99, 3], [200, 7, 7, 7, 31], list(range(40, 72))]


@pytest.fixture
def numpy_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, ...]]]:
    """Shapes of the weights numpy multiplied, so a test knows which path ran."""
    calls: list[tuple[int, ...]] = []
    real = np.matmul

    def counting(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls.append(b.shape)
        return real(a, b)

    monkeypatch.setattr(cpu_blas.np, "matmul", counting)
    yield calls


def _layer(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias)
    assert use_decode_layout(layer) == 1 and type(layer) is BlasLinear
    return layer


def test_numpy_openblas_is_found_and_pinned_to_one_thread() -> None:
    assert cpu_blas.numpy_blas_ready(), "numpy's wheels bundle OpenBLAS; the path should be on here"
    assert cpu_blas.openblas_threads() == 1, "its worker threads would fight the engine's for two cores"


@pytest.mark.parametrize("bias", [False, True])
def test_one_row_goes_through_numpy_and_equals_f_linear(numpy_calls: list[tuple[int, ...]], bias: bool) -> None:
    layer = _layer(96, 200, bias)
    x = torch.randn(1, 96)
    with torch.inference_mode():
        out = layer(x)
    assert numpy_calls == [(96, 200)], "the [in, out] storage, as a numpy view"
    assert out.shape == (1, 200) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, layer.weight.detach(), None if layer.bias is None
                                             else layer.bias.detach()), rtol=1e-5, atol=1e-6)


def test_many_rows_and_leading_dims_go_through_numpy(numpy_calls: list[tuple[int, ...]]) -> None:
    layer = _layer(64, 48, True)
    x = torch.randn(2, 5, 64)  # a prefill chunk or a batch, with a leading dim
    with torch.inference_mode():
        out = layer(x)
    assert numpy_calls == [(64, 48)] and out.shape == (2, 5, 48)
    torch.testing.assert_close(out, F.linear(x, layer.weight.detach(), layer.bias.detach()), rtol=1e-5, atol=1e-6)


def test_other_cases_keep_torch_s_kernel_bit_for_bit(numpy_calls: list[tuple[int, ...]]) -> None:
    layer = _layer(64, 48, True)
    w, b = layer.weight.detach(), layer.bias.detach()
    one = torch.randn(1, 64)
    with torch.inference_mode():
        previous = cpu_blas.set_enabled(False)
        try:
            assert torch.equal(layer(one), F.linear(one, w, b)), "switched off"
        finally:
            cpu_blas.set_enabled(previous)
    assert torch.equal(layer(one), F.linear(one, w, b)), "grad enabled (training, autograd): torch's kernel"
    layer.weight.data = layer.weight.data.contiguous()  # row-major storage: no [in, out] view to hand numpy
    with torch.inference_mode():
        assert torch.equal(layer(one), F.linear(one, layer.weight.detach(), b))
    assert numpy_calls == []


def test_bf16_weights_stay_plain_linear() -> None:
    layer = nn.Linear(16, 8).to(torch.bfloat16)
    use_decode_layout(layer)
    assert type(layer) is nn.Linear


def _engine(path: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", device="cpu",
                                  knobs=SchedulerKnobs(enable_prefix_caching=False)))


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])  # qwen2: biased q/k/v
def test_engine_output_and_logits_equal_torch_s_kernel(request: pytest.FixtureRequest, fixture: str,
                                                       numpy_calls: list[tuple[int, ...]]) -> None:
    engine = _engine(request.getfixturevalue(fixture))
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    single = [engine.generate([p], params)[0] for p in PROMPTS]  # one sequence: batch-1 decode steps
    batched = engine.generate(PROMPTS, params)
    hidden = torch.randn(1, engine.model_config.hidden_size)
    with torch.inference_mode():
        logits = engine.runner.model.compute_logits(hidden)
    assert numpy_calls, "prefill, decode and the head went through numpy"
    previous = cpu_blas.set_enabled(False)
    try:
        assert [engine.generate([p], params)[0] for p in PROMPTS] == single
        assert engine.generate(PROMPTS, params) == batched
        with torch.inference_mode():
            torch.testing.assert_close(engine.runner.model.compute_logits(hidden), logits, rtol=1e-5, atol=1e-5)
    finally:
        cpu_blas.set_enabled(previous)
