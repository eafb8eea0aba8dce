"""A GGUF file's tensors, dequantized, into `LlamaModel`'s parameters.

Every tensor goes through `gguf.quants.dequantize` (the `gguf` package's numpy reference for F32, F16, BF16, Q8_0,
Q4_0, Q4_1, the K-quants and more) to float32, then is copied into the parameter, which casts it to the serving
dtype. llama.cpp's converter permutes the rows of Llama's q and k projections so that rope rotates interleaved
pairs (convert_hf_to_gguf.py, LlamaModel.permute); this model rotates halves as Hugging Face does, so those rows are
permuted back exactly as transformers' GGUF loader does (LlamaTensorProcessor._reverse_permute_weights).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import dequantize

from gpu_runtime.checkpoint.gguf.reader import GGUFFile

# llama.cpp tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_ROPE_PERMUTED_ARCHS = ("llama", "mistral")  # llama.cpp permutes q/k only for these
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency rope factors (Llama 3.1 scaling), [head_dim / 2]


def hf_name(gguf_name: str) -> str:
    """The Hugging Face checkpoint name of a llama.cpp tensor; raises ValueError for a tensor with no place."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a Llama-family model")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def dequantized(tensor: ReaderTensor) -> torch.Tensor:
    """The tensor as float32 in PyTorch's [out_features, in_features] order (GGUF lists dimensions reversed)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    qtype = GGMLQuantizationType(int(tensor.tensor_type))
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        values = np.asarray(tensor.data, dtype=np.float32)  # already typed by the reader
    else:
        try:
            values = dequantize(np.asarray(tensor.data), qtype)
        except NotImplementedError as error:
            raise ValueError(f"GGUF tensor {tensor.name!r} has type {qtype.name}, which is not supported") from error
    # A copy: F32 data is a read-only view of the memory-mapped file, which torch must not alias.
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: per head, rows (pair, 2) back to (2, pair). weight: [H * D, in]."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    permuted = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])  # [H, D/2, 2, in]
    return permuted.transpose(1, 2).reshape(weight.shape)


def hf_tensors(file: GGUFFile, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor of the file, q/k rows un-permuted."""
    permuted = file.architecture in _ROPE_PERMUTED_ARCHS
    for name, tensor in file.tensors.items():
        if name == ROPE_FREQS:  # not a weight: the model config carries it (gguf_model.config)
            continue
        target = hf_name(name)
        value = dequantized(tensor)
        if permuted and ".self_attn.q_proj." in target:
            value = unpermute_rope_rows(value, num_heads)
        elif permuted and ".self_attn.k_proj." in target:
            value = unpermute_rope_rows(value, num_kv_heads)
        yield target, value

