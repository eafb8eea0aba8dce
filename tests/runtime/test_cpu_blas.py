"""fp32 CPU linear layers through cpu_kernels.c and numpy's OpenBLAS (gpu_runtime.model.cpu_blas): the path is taken
here (OpenBLAS pinned to one thread), equals F.linear to fp32 rounding for one row (GEMV) and many (GEMM), leaves every
other case to F.linear bit for bit, and the engine's greedy output and logits are those of torch's kernel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams, SchedulerKnobs
from gpu_runtime.model import cpu_blas, cpu_kernels
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


# A projection's row (one pass, no prefetch), an output head's (rows of 8192 floats and more prefetch the input quads
# two ahead) and one past a pass of 32768 columns, each with 1-3 input rows past the last quad.
@pytest.mark.parametrize(("in_features", "out_features", "bias"), [
    (96, 200, False), (97, 200, True), (26, 8192, False), (35, 40000, True)])
def test_one_row_goes_through_the_c_gemv_or_numpy_and_equals_f_linear(
        numpy_calls: list[tuple[int, ...]], in_features: int, out_features: int, bias: bool) -> None:
    layer = _layer(in_features, out_features, bias)
    x = torch.randn(1, in_features)
    with torch.inference_mode():
        out = layer(x)
    assert numpy_calls == ([] if cpu_kernels.kernels() is not None else [(in_features, out_features)])
    assert out.shape == (1, out_features) and out.dtype == torch.float32
    expected = F.linear(x, layer.weight.detach(), None if layer.bias is None else layer.bias.detach())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        previous = cpu_kernels.set_enabled(False)  # no kernels: numpy's sgemv over the [in, out] storage
        try:
            torch.testing.assert_close(layer(x), out, rtol=1e-5, atol=1e-5)
        finally:
            cpu_kernels.set_enabled(previous)
    assert numpy_calls[-1] == (in_features, out_features), "the [in, out] storage, as a numpy view"


def test_a_prefill_chunk_with_leading_dims_takes_the_c_kernel_or_numpy(numpy_calls: list[tuple[int, ...]]) -> None:
    layer = _layer(64, 48, True)
    x = torch.randn(2, 300, 64)  # a prefill chunk, with a leading dim: 600 rows
    with torch.inference_mode():
        out = layer(x)
    assert numpy_calls == ([] if _rows_fast() else [(64, 48)]) and out.shape == (2, 300, 48)
    torch.testing.assert_close(out, F.linear(x, layer.weight.detach(), layer.bias.detach()), rtol=1e-5, atol=1e-5)


def _rows_fast() -> bool:
    lib = cpu_kernels.kernels()
    return lib is not None and bool(lib.gemm_f32_rows_fast())


# Whole 8 x 32 tiles, and every edge: rows below a tile (1-7 left over), columns below a strip, inputs below a
# 128-row block, several blocks of inputs with a short last one and several chunks of 1024 columns (the strips a
# tile prefetches cross both).
@pytest.mark.parametrize(("rows", "in_features", "out_features"), [
    (2, 64, 32), (8, 128, 64), (16, 576, 960), (9, 100, 70), (33, 65, 33), (64, 1536, 96), (7, 3, 5),
    (5, 300, 1100), (23, 576, 2080)])
def test_a_batched_step_s_rows_go_through_the_c_kernel_and_equal_f_linear(
        numpy_calls: list[tuple[int, ...]], rows: int, in_features: int, out_features: int) -> None:
    layer = _layer(in_features, out_features, True)
    x = torch.randn(rows, in_features)
    with torch.inference_mode():
        out = layer(x)
    # Where this build has AVX-512 (this project's machines do) the kernel runs; elsewhere numpy, as before.
    assert numpy_calls == ([] if _rows_fast() else [(in_features, out_features)])
    torch.testing.assert_close(out, F.linear(x, layer.weight.detach(), layer.bias.detach()), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        previous = cpu_kernels.set_enabled(False)  # the kernels switched off: numpy's product, the same values
        try:
            torch.testing.assert_close(layer(x), out, rtol=1e-5, atol=1e-5)
        finally:
            cpu_kernels.set_enabled(previous)


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
                                                       numpy_calls: list[tuple[int, ...]],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_calls: list[int] = []  # rows multiplied by cpu_kernels.c
    real_rows = cpu_blas._rows

    def counting(rows: torch.Tensor, weight_t: np.ndarray) -> torch.Tensor | None:
        y = real_rows(rows, weight_t)
        kernel_calls.extend([rows.shape[0]] if y is not None else [])
        return y

    monkeypatch.setattr(cpu_blas, "_rows", counting)
    engine = _engine(request.getfixturevalue(fixture))
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    single = [engine.generate([p], params)[0] for p in PROMPTS]  # one sequence: batch-1 decode steps
    batched = engine.generate(PROMPTS, params)
    hidden = torch.randn(1, engine.model_config.hidden_size)
    with torch.inference_mode():
        logits = engine.runner.model.compute_logits(hidden)
    assert numpy_calls or kernel_calls, "prefill, decode and the head went through the kernels or numpy"
    if cpu_kernels.kernels() is not None:
        assert 1 in kernel_calls, "a batch-1 step's head (and the logits above) took the C GEMV"
    previous = cpu_blas.set_enabled(False)
    try:
        assert [engine.generate([p], params)[0] for p in PROMPTS] == single
        assert engine.generate(PROMPTS, params) == batched
        with torch.inference_mode():
            torch.testing.assert_close(engine.runner.model.compute_logits(hidden), logits, rtol=1e-5, atol=1e-5)
    finally:
        cpu_blas.set_enabled(previous)
