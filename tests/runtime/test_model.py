"""Our model's logits against Hugging Face transformers' reference implementation, fp32.

Tolerance: max |ours - HF| <= 1e-4 on logits of order 1 (fp32 reorders sums; measured differences are ~1e-6).
Covers llama3 rope scaling and GQA (llama preset), q/k/v biases (qwen2 preset), sharded safetensors loading, and
every attention path: fresh prefill, prefill continuing from cached blocks, batched decode with padded queries.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from gpu_runtime.engine.llm_engine import EngineConfig, LLMEngine, SamplingParams
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.model import cpu_kernels
from gpu_runtime.model.attention import batched_attention_bmm, batched_attention_sdpa

ATOL = 1e-4
BLOCK_SIZE = 4


def _hf_logits(path: Path, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def _runner(path: Path) -> ModelRunner:
    return ModelRunner(
        path, torch.float32, torch.device("cpu"), max_model_len=256, block_size=BLOCK_SIZE, num_blocks=64
    )


def _prompt(seed: int, length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])
def test_prefill_logits_match_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    runner = _runner(path)
    long_prompt, short_prompt = _prompt(1, 37, runner.config.vocab_size), _prompt(2, 9, runner.config.vocab_size)
    inputs = [
        SequenceInput(long_prompt, 0, list(range(10, 20)), num_logits=len(long_prompt)),
        SequenceInput(short_prompt, 0, [40, 41, 42], num_logits=len(short_prompt)),
    ]
    ours = runner.execute(inputs)
    expected = torch.cat([_hf_logits(path, long_prompt), _hf_logits(path, short_prompt)])
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max().item() <= ATOL


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])
def test_chunked_prefill_and_decode_logits_match_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    runner = _runner(path)
    vocab = runner.config.vocab_size
    a, b = _prompt(3, 45, vocab), _prompt(4, 30, vocab)
    ref_a, ref_b = _hf_logits(path, a), _hf_logits(path, b)
    blocks_a, blocks_b = list(range(0, 12)), list(range(20, 28))
    # Step 1: first chunk of a (fresh prefill path), all of b but its last 3 tokens.
    runner.execute([SequenceInput(a[:20], 0, blocks_a, 0), SequenceInput(b[:27], 0, blocks_b, 0)])
    # Step 2: rest of a's prompt from cached context (prefill-with-context path), one token of b (batched path).
    out = runner.execute([SequenceInput(a[20:40], 20, blocks_a, 20), SequenceInput(b[27:28], 27, blocks_b, 1)])
    assert (out[:20] - ref_a[20:40]).abs().max().item() <= ATOL
    assert (out[20] - ref_b[27]).abs().max().item() <= ATOL
    # Step 3: one token of a and two of b, as speculative verification would send (padded batched group).
    out = runner.execute([SequenceInput(a[40:41], 40, blocks_a, 1), SequenceInput(b[28:30], 28, blocks_b, 2)])
    assert (out[0] - ref_a[40]).abs().max().item() <= ATOL
    assert (out[1:] - ref_b[28:30]).abs().max().item() <= ATOL
    # Steps 4..: plain decode.
    for pos in range(41, 45):
        out = runner.execute([SequenceInput([a[pos]], pos, blocks_a, 1)])
        assert (out[0] - ref_a[pos]).abs().max().item() <= ATOL


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])
def test_greedy_generation_matches_transformers_generate(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    engine = LLMEngine(EngineConfig(model=str(path), kv_cache_memory_bytes=4 << 20))
    prompt = engine.tokenizer.encode("Once upon a time there was a small model")
    ours = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert ours == out[0, len(prompt) :].tolist()


def test_bfloat16_runner_tracks_float32(nano_llama: Path) -> None:
    """bf16 weights and KV: logits stay close to fp32 (bf16 has ~3 significant digits, so a loose bound)."""
    prompt = _prompt(5, 40, 512)
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        runner = ModelRunner(
            nano_llama, dtype, torch.device("cpu"), max_model_len=128, block_size=BLOCK_SIZE, num_blocks=16
        )
        runner.execute([SequenceInput(prompt[:-1], 0, list(range(11)), 0)])
        logits[dtype] = runner.execute([SequenceInput(prompt[-1:], 39, list(range(11)), 1)])[0]
    scale = logits[torch.float32].abs().max().item()
    assert (logits[torch.bfloat16] - logits[torch.float32]).abs().max().item() < 0.1 * scale


@pytest.mark.parametrize("num_queries", [1, 3])
def test_batched_attention_paths_agree(num_queries: int) -> None:
    """The bmm path (CPU) and the SDPA path (taken on CUDA) compute the same attention; run both here on CPU."""
    gen = torch.Generator().manual_seed(0)
    b, heads, kv_heads, dim, s = 3, 8, 2, 16, 20
    q = torch.randn(b, num_queries, heads, dim, generator=gen)
    keys, values = torch.randn(kv_heads, b, s, dim, generator=gen), torch.randn(kv_heads, b, s, dim, generator=gen)
    lengths = torch.tensor([5, 20, 11])
    query_pos = (lengths - num_queries)[:, None] + torch.arange(num_queries)[None, :]
    allowed = torch.arange(s)[None, None, :] <= query_pos[:, :, None]  # [B, Q, S]
    bias = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))[None, :, None]
    bmm = batched_attention_bmm(q, keys, values, bias)
    sdpa = batched_attention_sdpa(q, keys, values, bias)
    assert (bmm - sdpa).abs().max().item() <= 1e-5


def test_batch1_decode_over_contiguous_blocks_equals_the_gathered_path(nano_llama: Path) -> None:
    """Batch-1 decode over consecutive block ids attends to a slice of the cache (no gather); over scattered ids it
    gathers. The same prompt in both layouts gives the same logits bit for bit (PyTorch's path both times: the C
    batch-1 path, tests/runtime/test_cpu_decode.py, would take the contiguous layout)."""
    previous = cpu_kernels.set_enabled(False)
    try:
        _two_layouts(_runner(nano_llama))
    finally:
        cpu_kernels.set_enabled(previous)


def _two_layouts(runner: ModelRunner) -> None:
    prompt = _prompt(5, 40, runner.config.vocab_size)
    contiguous, scattered = list(range(10)), [31, 17, 25, 12, 40, 13, 29, 18, 44, 21]  # 40 tokens, 4 a block
    assert runner._groups([SequenceInput(prompt[-1:], 39, contiguous, 1)])[0].key_slot == 0
    assert runner._groups([SequenceInput(prompt[-1:], 39, scattered, 1)])[0].key_slot == -1
    logits = []
    for blocks in (contiguous, scattered):
        runner.execute([SequenceInput(prompt[:39], 0, blocks, 0)])
        logits.append(runner.execute([SequenceInput(prompt[39:], 39, blocks, 1)])[0])
    assert torch.equal(logits[0], logits[1])
