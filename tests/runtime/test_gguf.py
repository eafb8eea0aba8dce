"""GGUF files the tests write themselves (tests/runtime/gguf_builder.py): dequantization of every supported type
against numpy references of the block formats, llama.cpp's q/k permutation undone, and a GGUF of the nano checkpoint
serving the same logits, token ids and chat template as the checkpoint itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from gpu_runtime.checkpoint.files import read_model_config
from gpu_runtime.checkpoint.gguf.reader import open_gguf
from gpu_runtime.checkpoint.gguf.weights import dequantized, unpermute_rope_rows
from gpu_runtime.engine.model_runner import ModelRunner, SequenceInput
from gpu_runtime.server.chat import ChatTemplate
from gpu_runtime.server.protocol import ChatMessage
from gpu_runtime.tokenizer.tokenizer import Tokenizer
from tests.runtime.gguf_builder import add_tensor, llama_cpp_permute, without_rope_scaling, write_gguf

# Largest |dequantized - original| for N(0, 1) values: what each format's rounding allows.
_TOLERANCE = {Q.F32: 0.0, Q.F16: 2e-3, Q.BF16: 2e-2, Q.Q8_0: 0.05, Q.Q4_0: 0.6, Q.Q4_1: 0.6}


def _half(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)


def reference_dequantize(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """ggml's block formats (ggml-common.h), from the file's bytes: the test's own reading, not the gguf package's."""
    if qtype is Q.F32:
        return raw.view(np.float32)
    if qtype is Q.F16:
        return raw.view(np.float16).astype(np.float32)
    if qtype is Q.BF16:  # the upper half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if qtype is Q.Q8_0:  # fp16 scale d, 32 int8: d * q
        blocks = raw.reshape(-1, 34)
        return (_half(blocks[:, :2]) * blocks[:, 2:].view(np.int8)).reshape(-1)
    offset = 2 if qtype is Q.Q4_0 else 4  # Q4_0: d; Q4_1: d, m
    blocks = raw.reshape(-1, 16 + offset)
    nibbles = np.concatenate([blocks[:, offset:] & 0xF, blocks[:, offset:] >> 4], axis=1).astype(np.float32)
    if qtype is Q.Q4_0:  # d * (q - 8), low nibbles are elements 0..15, high nibbles 16..31
        return (_half(blocks[:, :2]) * (nibbles - 8)).reshape(-1)
    return (_half(blocks[:, :2]) * nibbles + _half(blocks[:, 2:4])).reshape(-1)  # Q4_1: d * q + m


@pytest.mark.parametrize("qtype", list(_TOLERANCE), ids=lambda q: q.name)
def test_dequantization_matches_the_block_format(tmp_path: Path, qtype: Q) -> None:
    original = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    writer = GGUFWriter(tmp_path / "one.gguf", "llama")
    add_tensor(writer, "blk.0.ffn_up.weight", original, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    [tensor] = open_gguf(tmp_path / "one.gguf").tensors.values()
    loaded = dequantized(tensor)
    assert loaded.shape == (6, 96) and loaded.dtype == torch.float32
    raw = np.asarray(tensor.data).view(np.uint8).reshape(-1)
    np.testing.assert_array_equal(loaded.numpy().reshape(-1), reference_dequantize(raw, qtype))
    assert np.abs(loaded.numpy() - original).max() <= _TOLERANCE[qtype]


@pytest.mark.parametrize("num_heads", [1, 3])
def test_unpermute_undoes_llama_cpp_permute(num_heads: int) -> None:
    weight = torch.randn(num_heads * 8, 5)
    permuted = torch.from_numpy(llama_cpp_permute(weight.numpy(), num_heads))
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_rope_rows(permuted, num_heads), weight)


@pytest.fixture(scope="module")
def plain_nano(nano_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return without_rope_scaling(nano_llama, tmp_path_factory.mktemp("plain") / "nano")


@pytest.fixture(scope="module")
def nano_gguf(plain_nano: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(plain_nano, tmp_path_factory.mktemp("gguf") / "nano.gguf")


def _logits(model: Path, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, torch.float32, torch.device("cpu"), 128, 16, num_blocks=8)
    return runner.execute([SequenceInput(ids, 0, [0, 1, 2], num_logits=len(ids))])


def test_f32_gguf_serves_the_checkpoint_exactly(plain_nano: Path, nano_gguf: Path) -> None:
    got, expected = read_model_config(nano_gguf), read_model_config(plain_nano)
    assert got.rms_norm_eps == pytest.approx(expected.rms_norm_eps)  # GGUF stores it as float32
    assert dataclasses.replace(got, rms_norm_eps=expected.rms_norm_eps) == expected
    ids = list(range(3, 40))
    torch.testing.assert_close(_logits(nano_gguf, ids), _logits(plain_nano, ids), rtol=0, atol=1e-6)


def test_llama31_rope_factors_serve_the_checkpoint(nano_llama: Path, tmp_path: Path) -> None:
    # llama.cpp's converter stores Llama 3.1/3.2 scaling as a rope_freqs tensor and no metadata key; applied as
    # llama.cpp does (inverse frequency / factor) it must give the HF checkpoint's positions.
    assert read_model_config(nano_llama).rope_scaling.rope_type == "llama3"
    scaled = write_gguf(nano_llama, tmp_path / "llama31.gguf")
    config = read_model_config(scaled)
    assert config.rope_scaling.rope_type == "default" and len(config.rope_scaling.freq_factors) == config.head_dim // 2
    assert max(config.rope_scaling.freq_factors) > 1  # the test checkpoint's scaling moves some frequencies
    ids = list(range(3, 48))  # what the 3 KV blocks of _logits hold
    torch.testing.assert_close(_logits(scaled, ids), _logits(nano_llama, ids), rtol=0, atol=1e-5)
    plain = write_gguf(without_rope_scaling(nano_llama, tmp_path / "plain"), tmp_path / "plain.gguf")
    assert not torch.allclose(_logits(plain, ids), _logits(nano_llama, ids), atol=1e-3)  # scaling matters here


@pytest.mark.parametrize(("qtype", "atol"), [(Q.F16, 0.01), (Q.Q8_0, 0.1)], ids=lambda v: getattr(v, "name", v))
def test_quantized_gguf_stays_close(plain_nano: Path, tmp_path: Path, qtype: Q, atol: float) -> None:
    ids = list(range(3, 20))
    quantized = write_gguf(plain_nano, tmp_path / f"{qtype.name}.gguf", qtype)
    assert read_model_config(quantized).torch_dtype == ("float16" if qtype is Q.F16 else "float32")
    torch.testing.assert_close(_logits(quantized, ids), _logits(plain_nano, ids), rtol=0, atol=atol)


def test_tokenizer_and_chat_template_come_from_the_metadata(plain_nano: Path, nano_gguf: Path) -> None:
    expected, got = Tokenizer(plain_nano), Tokenizer(nano_gguf)
    for text in ["Hello, world! Once upon a time.", "héllo wörld, 世界 ✓ 🙂", "<|im_start|>user\nhi<|im_end|>\n  x"]:
        assert got.encode(text) == expected.encode(text)
        assert got.decode(got.encode(text), skip_special_tokens=False) == text
    assert (got.eos_token_id, got.bos_token_id, got.vocab_size) == (
        expected.eos_token_id, expected.bos_token_id, expected.vocab_size)
    assert ChatTemplate.from_model(nano_gguf) == ChatTemplate.from_model(plain_nano)


def test_checkpoint_chat_template_jinja_wins(plain_nano: Path, tmp_path: Path) -> None:
    """transformers 5 saves the template as chat_template.jinja, not inside tokenizer_config.json."""
    model = without_rope_scaling(plain_nano, tmp_path / "v5")
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    (model / "chat_template.jinja").write_text(template)

    assert ChatTemplate.from_model(model).render([ChatMessage(role="user", content="hi")]) == "[user] hi"
    assert Tokenizer(model).chat_template == (model / "chat_template.jinja").read_text()


@pytest.mark.parametrize("damage", ["truncated", "not_gguf", "unknown_arch"])
def test_bad_gguf_files_are_value_errors(nano_gguf: Path, tmp_path: Path, damage: str) -> None:
    bad = tmp_path / "bad.gguf"
    if damage == "truncated":
        bad.write_bytes(nano_gguf.read_bytes()[:5000])
    elif damage == "not_gguf":
        bad.write_text("hello")
    else:
        writer = GGUFWriter(bad, "mamba")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    with pytest.raises(ValueError, match="GGUF"):
        read_model_config(bad)
