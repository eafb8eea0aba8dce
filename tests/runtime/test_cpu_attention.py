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


# head_dim 16 / 64 / 128 (one, four and eight vectors: 16, 4 and 2 query heads at once, so a KV group of 3 at
# head_dim 128 runs in two passes) and 40 (the scalar loop); key counts off a multiple of 16 (the masked tail).
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 16), (6, 2, 128), (4, 4, 40)])
def test_the_kernel_equals_softmax_attention_over_each_table(heads: int, kv_heads: int, head_dim: int) -> None:
    lib = cpu_kernels.kernels()
    gen = torch.Generator().manual_seed(heads * head_dim)
    block_size, num_blocks = 8, 24
    k_cache, v_cache = (torch.randn(kv_heads, num_blocks * block_size, head_dim, generator=gen) for _ in range(2))
    seq_keys = torch.tensor([1, 17, 45], dtype=torch.long)
    tables = torch.randperm(num_blocks, generator=gen)[:18].view(3, 6).contiguous()
    q = torch.randn(3, heads, head_dim, generator=gen) * 3  # peaked softmaxes as well as flat ones
    out = torch.empty_like(q)
    scores = torch.empty(heads // kv_heads * int(seq_keys.max()))
    lib.attend_decode_batch(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1],
                            tables.data_ptr(), 6, seq_keys.data_ptr(), 3, block_size, heads, kv_heads, head_dim,
                            scores.data_ptr(), out.data_ptr())
    for b in range(3):
        slots = (tables[b][:, None] * block_size + torch.arange(block_size)).flatten()[: int(seq_keys[b])]
        keys = k_cache[:, slots].repeat_interleave(heads // kv_heads, dim=0)  # [heads, n, d]
        values = v_cache[:, slots].repeat_interleave(heads // kv_heads, dim=0)
        probs = (torch.einsum("hd,hnd->hn", q[b], keys) / head_dim**0.5).softmax(-1)
        torch.testing.assert_close(out[b], torch.einsum("hn,hnd->hd", probs, values), rtol=1e-5, atol=1e-5)
