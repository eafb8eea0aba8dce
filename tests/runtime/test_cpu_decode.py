"""The C batch-1 decode path (gpu_runtime/model/cpu_decode.py) against the PyTorch path it stands in for: the same
logits up to fp32 summation order, int8 included, built only where it runs and rebuilt when the weights change."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.model import cpu_kernels
from gpu_runtime.quant.apply import quantize_model

pytestmark = pytest.mark.skipif(cpu_kernels.kernels() is None, reason="no C compiler for the CPU kernels")
BLOCK_SIZE = 4


@contextmanager
def _kernels(enabled: bool) -> Iterator[None]:
    previous = cpu_kernels.set_enabled(enabled)
    try:
        yield
    finally:
        cpu_kernels.set_enabled(previous)


def _runner(path: Path) -> ModelRunner:
    return ModelRunner(path, torch.float32, torch.device("cpu"), max_model_len=128, block_size=BLOCK_SIZE,
                       num_blocks=32)


def _decode_logits(runner: ModelRunner, prompt: list[int], enabled: bool) -> torch.Tensor:
    """Logits of the prompt's last token decoded alone (batch 1, contiguous blocks) after a prefill of the rest."""
    blocks = list(range(-(-len(prompt) // BLOCK_SIZE)))
    with _kernels(enabled):
        runner.execute([SequenceInput(prompt[:-1], 0, blocks, 0)])
        return runner.execute([SequenceInput(prompt[-1:], len(prompt) - 1, blocks, 1)])[0]


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])
def test_fp32_logits_equal_the_pytorch_path(fixture: str, request: pytest.FixtureRequest) -> None:
    runner = _runner(request.getfixturevalue(fixture))
    prompt = torch.randint(0, runner.config.vocab_size, (37,), generator=torch.Generator().manual_seed(3)).tolist()
    theirs = _decode_logits(runner, prompt, False)
    ours = _decode_logits(runner, prompt, True)
    assert runner._decoder is not None  # the step really ran in C
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_int8_logits_track_the_pytorch_path(tiny_llama_sharded: Path) -> None:
    """C multiplies int8 weights with fp32 activations, torch's CPU kernel with bf16 ones: close, not equal."""
    runner = _runner(tiny_llama_sharded)
    quantize_model(runner.model, "int8")
    prompt = list(range(5, 30))
    theirs = _decode_logits(runner, prompt, False)
    ours = _decode_logits(runner, prompt, True)
    assert runner._decoder is not None
    assert (ours - theirs).abs().max().item() < 0.02 * theirs.abs().max().item()


def test_int8_kernel_equals_the_dequantized_product() -> None:
    lib = cpu_kernels.kernels()
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (37, 70), generator=gen, dtype=torch.int8)  # odd sizes: the vector tails
    scale, x, y = torch.rand(37, generator=gen), torch.randn(70, generator=gen), torch.empty(37)
    lib.gemv_i8(x.data_ptr(), q.data_ptr(), scale.data_ptr(), 70, 37, y.data_ptr())
    torch.testing.assert_close(y, (q.float() @ x) * scale, rtol=1e-5, atol=1e-5)


def test_greedy_output_is_unchanged_and_a_quantization_switch_builds_anew(tiny_llama_sharded: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_sharded), dtype="float32", device="cpu"))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[3, 17, 9, 44, 5], [8, 8, 1]]
    with _kernels(False):
        expected = [engine.generate([p], params)[0] for p in prompts]
    assert [engine.generate([p], params)[0] for p in prompts] == expected
    fp32_decoder = engine.runner._decoder
    engine.set_quantization("int8")
    engine.generate([prompts[0]], params)
    assert engine.runner._decoder is not None and engine.runner._decoder is not fp32_decoder


def test_switched_off_keeps_the_pytorch_path(nano_llama: Path) -> None:
    runner = _runner(nano_llama)
    with _kernels(False):
        assert cpu_kernels.kernels() is None
        runner.execute([SequenceInput([1, 2, 3], 0, [0], 1)])
        runner.execute([SequenceInput([4], 3, [0], 1)])
    assert runner._decoder is None
