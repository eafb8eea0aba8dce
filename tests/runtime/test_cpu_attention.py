"""The C decode attention of a batched step (gpu_runtime/model/cpu_attention.py) against the PyTorch path it stands in
for: sequences of different lengths, blocks scattered over the pool, GQA and a biased model; the same logits up to
fp32 summation order, and the same greedy output through the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.model import cpu_attention, cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels.kernels() is None, reason="no C compiler for the CPU kernels")
BLOCK_SIZE = 4
# Three sequences: 9, 22 and 14 tokens of context, their blocks out of order and interleaved in the pool.
TABLES = [[17, 3, 29], [5, 30, 11, 0, 24, 8], [2, 19, 13, 26]]
LENGTHS = [9, 22, 14]


def _prefilled(runner: ModelRunner) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, runner.config.vocab_size, (n,), generator=gen).tolist() for n in LENGTHS]
    for prompt, table in zip(prompts, TABLES, strict=True):
        runner.execute([SequenceInput(prompt[:-1], 0, table, 0)])
    return prompts


def _decode_step(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    """One batched decode step: each sequence's last prompt token at its position, all three at once."""
    return runner.execute([SequenceInput(p[-1:], len(p) - 1, table, 1)
                           for p, table in zip(prompts, TABLES, strict=True)])


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])  # qwen2: GQA with biased q/k/v
def test_batched_decode_attention_in_c_equals_the_pytorch_path(fixture: str, request: pytest.FixtureRequest,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ModelRunner(request.getfixturevalue(fixture), torch.float32, torch.device("cpu"), max_model_len=128,
                         block_size=BLOCK_SIZE, num_blocks=32)
    prompts = _prefilled(runner)
    calls: list[int] = []
    real = cpu_attention.decode_attention

    def counted(*args: object) -> torch.Tensor | None:
        out = real(*args)  # type: ignore[arg-type]
        calls.extend([out.shape[0]] if out is not None else [])
        return out

    monkeypatch.setattr(cpu_attention, "decode_attention", counted)
    ours = _decode_step(runner, prompts)
    assert calls and set(calls) == {3}, "every layer attended the three sequences in C"
    monkeypatch.setattr(cpu_attention, "decode_attention", lambda *args: None)
    theirs = _decode_step(runner, prompts)  # the same slots rewritten with the same K/V: the same step again
    assert ours.shape == (3, runner.config.vocab_size)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_the_engine_s_batched_greedy_output_is_that_of_the_pytorch_path(tiny_qwen2: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_qwen2), dtype="float32", device="cpu"))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[3, 17, 9, 44, 5], [8, 8, 1], list(range(40, 71))]
    ours = engine.generate(prompts, params)
    monkeypatch.setattr(cpu_attention, "decode_attention", lambda *args: None)
    assert engine.generate(prompts, params) == ours
