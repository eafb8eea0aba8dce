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
from gpu_runtime.model.cpu_decode import Batch1Decoder
from gpu_runtime.quant import int8_blocks
from gpu_runtime.quant.apply import quantize_model, weight_bytes
from gpu_runtime.quant.embedding import QuantizedEmbedding
from gpu_runtime.quant.int8_blocks import Int8BlockLinear

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


def _decode_logits(runner: ModelRunner, prompt: list[int], enabled: bool,
                   blocks: list[int] | None = None) -> torch.Tensor:
    """Logits of the prompt's last token decoded alone (batch 1) after a prefill of the rest, over `blocks` (default:
    side by side from block 0)."""
    blocks = blocks if blocks is not None else list(range(-(-len(prompt) // BLOCK_SIZE)))
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


@pytest.mark.parametrize("fixture", ["tiny_llama_sharded", "tiny_qwen2"])
def test_scattered_blocks_decode_in_c_and_equal_the_pytorch_path(fixture: str, request: pytest.FixtureRequest,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Free-list churn scatters a sequence's blocks over the pool. The C step used to run only over side-by-side
    # blocks, so after a while a server's batch-1 steps all fell back to the PyTorch path (the real-model benchmark's
    # fp32 rounds slowed 18 -> 38 ms a token as its requests went by). Blocks out of order, one past another's end.
    runner = _runner(request.getfixturevalue(fixture))
    prompt = torch.randint(0, runner.config.vocab_size, (37,), generator=torch.Generator().manual_seed(7)).tolist()
    scattered = [31, 4, 17, 2, 30, 9, 22, 11, 0, 25]  # 10 blocks of 4 slots for 37 keys
    calls: list[int] = []
    real = Batch1Decoder.hidden

    def counted(self: Batch1Decoder, *args: object) -> torch.Tensor:
        calls.append(1)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Batch1Decoder, "hidden", counted)
    theirs = _decode_logits(runner, prompt, False, scattered)
    ours = _decode_logits(runner, prompt, True, scattered)
    assert calls == [1], "the scattered step ran in C"
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    # Where the blocks lie changes nothing but addresses: the same keys, the same sums.
    torch.testing.assert_close(_decode_logits(runner, prompt, True), ours, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("blocks", [None, [9, 3, 27, 0, 14, 6, 21]], ids=["side-by-side", "scattered"])
def test_int8_logits_track_the_pytorch_path(tiny_llama_sharded: Path, blocks: list[int] | None) -> None:
    """C multiplies int8 weights with fp32 activations, torch's CPU kernel with bf16 ones: close, not equal."""
    runner = _runner(tiny_llama_sharded)
    quantize_model(runner.model, "int8")
    prompt = list(range(5, 30))
    theirs = _decode_logits(runner, prompt, False, blocks)
    ours = _decode_logits(runner, prompt, True, blocks)
    assert runner._decoder is not None
    assert (ours - theirs).abs().max().item() < 0.02 * theirs.abs().max().item()


def test_int8_head_is_int8_and_runs_in_c_as_the_pytorch_path_computes_it(
        tiny_llama_sharded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 quantizes the output head and embedding too (one int8 table with 32-input block scales), and the head's
    product runs in C on CPU: the same values as the dequantized fp32 product torch runs without the kernels."""
    runner = _runner(tiny_llama_sharded)
    model = runner.model
    fp32_bytes, table_bytes = weight_bytes(model), model.lm_head.weight.numel() * 4
    quantize_model(model, "int8")
    head = model.lm_head
    assert isinstance(head, Int8BlockLinear) and isinstance(model.embed_tokens, QuantizedEmbedding)
    assert head.weight_int8.dtype == torch.int8 and head.scale.shape == (head.out_features, head.in_features // 32)
    assert weight_bytes(model) < (fp32_bytes - table_bytes) / 4 + table_bytes / 2  # no fp32 table left
    calls = []

    def counting() -> object:
        lib = cpu_kernels.kernels()
        calls.append(lib)
        return lib

    monkeypatch.setattr(int8_blocks, "kernels", counting)
    prompt = list(range(5, 30))
    ours = _decode_logits(runner, prompt, True)
    assert runner._decoder is not None and calls[-1] is not None  # the step ran in C, its head too
    hidden = torch.randn(3, head.in_features, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        in_c = head(hidden)
        with _kernels(False):
            in_torch = head(hidden)
    torch.testing.assert_close(in_c, in_torch, rtol=1e-5, atol=1e-5)
    theirs = _decode_logits(runner, prompt, False)
    assert (ours - theirs).abs().max().item() < 0.02 * theirs.abs().max().item()
    assert ours.argmax() == theirs.argmax()


def test_int8_block_kernel_equals_the_dequantized_product() -> None:
    lib = cpu_kernels.kernels()
    gen = torch.Generator().manual_seed(0)
    for n_in, block in ((96, 32), (160, 32), (70, 70)):  # odd and even block counts, a row that is one block
        q = torch.randint(-127, 128, (37, n_in), generator=gen, dtype=torch.int8)
        scale, x, y = torch.rand(37, n_in // block, generator=gen), torch.randn(3, n_in, generator=gen), \
            torch.empty(3, 37)
        lib.gemm_i8_blocks(x.data_ptr(), q.data_ptr(), scale.data_ptr(), 3, n_in, 37, block, y.data_ptr())
        dequant = (q.float().view(37, -1, block) * scale[:, :, None]).view(37, n_in)
        expected = x @ dequant.T  # sums of ~100 products of size ~100: fp32 order differences scale with them
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())


# Every loop of the dot product: 64 inputs a step (576: SmolLM2's rows), 16 a step after them (48, 100), one by one
# (70, 100: the tails).
@pytest.mark.parametrize("n_in", [70, 48, 100, 576])
def test_int8_kernel_equals_the_dequantized_product(n_in: int) -> None:
    lib = cpu_kernels.kernels()
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (37, n_in), generator=gen, dtype=torch.int8)  # 37 rows: odd
    scale, x, y = torch.rand(37, generator=gen), torch.randn(n_in, generator=gen), torch.empty(37)
    lib.gemv_i8(x.data_ptr(), q.data_ptr(), scale.data_ptr(), n_in, 37, y.data_ptr())
    expected = (q.float() @ x) * scale
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())


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


def _decoded_in_c(path: Path, seed: int) -> tuple[ModelRunner, list[int], Batch1Decoder]:
    """A runner that decoded a 21-token prompt's last token in C, the prompt, and the decoder it built."""
    runner = _runner(path)
    prompt = torch.randint(0, runner.config.vocab_size, (21,), generator=torch.Generator().manual_seed(seed)).tolist()
    _decode_logits(runner, prompt, True)
    assert runner._decoder is not None
    return runner, prompt, runner._decoder


def test_a_weight_moved_in_any_layer_builds_anew_even_across_scattered_blocks(tiny_llama_sharded: Path) -> None:
    # The real-model benchmark stored the weights row-major and back between rounds: the first layer's weight came
    # back at its old address, the others elsewhere, and a decoder keyed on the first alone read freed memory
    # (greedy output changed). Here the last layer's MLP weight moves to new storage with other values, and the
    # step before runs on scattered blocks (once the PyTorch path, where the decoder was not checked at all).
    runner, prompt, built = _decoded_in_c(tiny_llama_sharded, seed=5)
    down = runner.model.layers[-1].mlp.down_proj
    with torch.no_grad():
        moved = (down.weight.detach() * 1.5).t().contiguous().t()  # the [in, out] layout, new storage and values
    down.weight.data = moved
    scattered = list(range(32))[::-2][: -(-len(prompt) // BLOCK_SIZE)]  # not consecutive
    runner.execute([SequenceInput(prompt[:-1], 0, scattered, 0)])
    runner.execute([SequenceInput(prompt[-1:], len(prompt) - 1, scattered, 1)])
    assert runner._decoder is not built  # checked on the scattered step too
    ours = _decode_logits(runner, prompt, True)
    theirs = _decode_logits(runner, prompt, False)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_parameter_replaced_builds_anew_and_steady_steps_keep_the_decoder(tiny_llama_sharded: Path) -> None:
    # Steps only read the kept tensors' addresses (the walk through the modules cost ~0.4 ms a step): a Parameter
    # replaced by another object is seen through the registration hooks, not through its address, which the old
    # Parameter object still holds.
    runner, prompt, built = _decoded_in_c(tiny_llama_sharded, seed=9)
    runner.execute([SequenceInput(prompt[-1:], len(prompt), list(range(6)), 1)])  # another step, nothing changed
    assert runner._decoder is built, "a step with nothing changed keeps the decoder"
    gate_up = runner.model.layers[0].mlp.gate_up_proj
    with torch.no_grad():
        gate_up.weight = torch.nn.Parameter((gate_up.weight.detach() * 0.5).t().contiguous().t())
    ours = _decode_logits(runner, prompt, True)
    assert runner._decoder is not built
    theirs = _decode_logits(runner, prompt, False)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_switched_off_keeps_the_pytorch_path(nano_llama: Path) -> None:
    runner = _runner(nano_llama)
    with _kernels(False):
        assert cpu_kernels.kernels() is None
        runner.execute([SequenceInput([1, 2, 3], 0, [0], 1)])
        runner.execute([SequenceInput([4], 3, [0], 1)])
    assert runner._decoder is None
