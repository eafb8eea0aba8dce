"""Batch-1 decode on CPU through the C kernels: every decoder layer of one token in a single call.

At batch 1 on CPU an eager step is ~25 small torch ops per layer, ~10 us each, next to GEMVs of a few hundred
microseconds: on SmolLM2 (30 layers) the ops cost about as much as streaming the weights. `Batch1Decoder` hands the
layers' weight, norm and KV cache addresses to gpu_runtime/model/cpu_kernels.c once, then runs a step as one
embedding row copy, one C call and the model's own final norm and LM head (whose int8 form runs in C by itself,
gpu_runtime.quant.int8_blocks). The C code computes what gpu_runtime.model.llama does for one token, attending over
the sequence's block table wherever its blocks lie (free-list churn scatters them: when only side-by-side blocks ran
in C, the real-model benchmark's fp32 engine fell back to the PyTorch path once they scattered, 18 ms a token, then
25-38 ms in later rounds), in fp32 with the additions in another order: logits agree to ~1e-6 and greedy tokens are
the same (tests/runtime/test_cpu_decode.py).

Supported: fp32 CPU models whose projections are fp32 in the column-major decode layout or Int8Linear (int8
weights are multiplied with fp32 activations here, where torch's CPU kernel rounds them to bf16), with an fp32 or
int8 embedding (gpu_runtime.quant.embedding). Anything else (bf16, CUDA, fp8, row-major weights, biases outside qkv)
builds no decoder and keeps the PyTorch path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from gpu_runtime.model.attention import RopeTables
from gpu_runtime.model.cpu_kernels import Layer, Shape, kernels
from gpu_runtime.quant.embedding import QuantizedEmbedding
from gpu_runtime.quant.int8 import Int8Linear

MAX_HEAD_DIM = 512  # the C rope's stack buffer


def _projection(module: nn.Module) -> tuple[int, int] | None:
    """(weight address, scale address or 0) in the layout the C kernels read, None where they cannot."""
    if isinstance(module, Int8Linear):
        ok = module.weight_int8.is_contiguous() and module.scale.dtype == torch.float32
        return (module.weight_int8.data_ptr(), module.scale.data_ptr()) if ok else None
    if isinstance(module, nn.Linear):
        weight = module.weight
        ok = weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.t().is_contiguous()
        return (weight.data_ptr(), 0) if ok else None
    return None


def _embedding_ok(module: nn.Module) -> bool:
    if isinstance(module, QuantizedEmbedding):
        return module.weight_q.dtype == torch.int8 and module.weight_q.device.type == "cpu" and \
            _fp32_cpu(module.scale)
    return isinstance(module, nn.Embedding)


def _fp32_cpu(tensor: torch.Tensor | None) -> bool:
    return tensor is not None and tensor.dtype == torch.float32 and tensor.device.type == "cpu" and \
        tensor.is_contiguous()


class Batch1Decoder:
    """The C layers of one model, its rope tables and KV caches (see the module docstring)."""

    def __init__(self, lib: ctypes.CDLL, model: nn.Module, rope: RopeTables,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], layers: ctypes.Array) -> None:
        cfg = model.config
        self._lib, self._model, self._rope, self._layers = lib, model, rope, layers
        # The C layers hold raw addresses: keeping their storages alive (detached tensors, not the Parameters, whose
        # `.data` may be swapped for another storage) means no later tensor can reuse an address, so DecoderWatch's
        # address check cannot mistake a replaced weight for the one built on.
        self._keep = [t.detach() for t in (*model.parameters(), *model.buffers(), *(t for kv in kv_caches for t in kv))]
        self._shape = Shape(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                            model.norm.eps, kv_caches[0][0].shape[1])
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        scratch = cfg.hidden_size + qkv + cfg.num_heads * cfg.head_dim + 2 * cfg.intermediate_size
        self._scratch = torch.empty(scratch + cfg.num_heads // cfg.num_kv_heads * rope.cos.shape[0])  # + scores
        self._x = torch.empty(cfg.hidden_size)
        self._out = torch.empty(1, cfg.hidden_size)

    @classmethod
    def build(cls, model: nn.Module, rope: RopeTables,
              kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> Batch1Decoder | None:
        """The decoder for this model, or None where the kernels are missing or the model is not supported."""
        lib = kernels()
        if lib is None or not kv_caches or not _fp32_cpu(rope.cos) or model.config.head_dim > MAX_HEAD_DIM:
            return None
        if not _embedding_ok(model.embed_tokens) or not _fp32_cpu(model.norm.weight):
            return None
        layers = [_layer(layer, kv) for layer, kv in zip(model.layers, kv_caches, strict=True)]
        if any(layer is None for layer in layers):
            return None
        return cls(lib, model, rope, kv_caches, (Layer * len(layers))(*layers))

    def hidden(self, token_id: int, position: int, block_ids: list[int], block_size: int) -> torch.Tensor:
        """Final hidden state [1, hidden] of one token at `position` of a sequence whose KV lives in `block_ids`
        (its block table, block_size slots each, anywhere in the cache): its K/V written at its slot, attending to
        the position + 1 keys up to it."""
        num_keys = position + 1
        used = -(-num_keys // block_size)
        if len(block_ids) < used:
            raise ValueError(f"{len(block_ids)} blocks hold fewer than the {num_keys} keys of position {position}")
        slot = block_ids[position // block_size] * block_size + position % block_size
        table = (ctypes.c_int64 * used)(*block_ids[:used])
        embedding = self._model.embed_tokens
        if isinstance(embedding, QuantizedEmbedding):  # the product QuantizedEmbedding.forward computes, in place
            scale = embedding.scale[token_id].view(-1, 1)  # [blocks, 1]; one block where the scale is per row
            blocks = scale.shape[0]
            torch.mul(embedding.weight_q[token_id].view(blocks, -1), scale, out=self._x.view(blocks, -1))
        else:
            self._x.copy_(embedding.weight[token_id])
        cos, sin = self._rope.cos[position], self._rope.sin[position]
        self._lib.decode_layers(self._layers, len(self._layers), ctypes.byref(self._shape), self._x.data_ptr(),
                                cos.data_ptr(), sin.data_ptr(), slot, table, block_size, num_keys,
                                self._scratch.data_ptr())
        norm = self._model.norm
        self._lib.rms_norm(self._x.data_ptr(), norm.weight.data_ptr(), norm.eps, self._x.shape[0],
                           self._out.data_ptr())
        return self._out


def _layer(layer: nn.Module, kv: tuple[torch.Tensor, torch.Tensor]) -> Layer | None:
    attn, mlp = layer.self_attn, layer.mlp
    projections = [_projection(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    bias = attn.qkv_proj.bias
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    if any(p is None for p in projections) or not all(_fp32_cpu(t) for t in (*norms, *kv)):
        return None
    if (bias is not None and not _fp32_cpu(bias)) or any(m.bias is not None for m in (attn.o_proj, mlp.gate_up_proj,
                                                                                        mlp.down_proj)):
        return None
    (qkv, qkv_s), (o, o_s), (gu, gu_s), (down, down_s) = projections  # type: ignore[misc]
    return Layer(qkv, o, gu, down, qkv_s or None, o_s or None, gu_s or None, down_s or None,
                 None if bias is None else bias.data_ptr(), norms[0].data_ptr(), norms[1].data_ptr(),
                 kv[0].data_ptr(), kv[1].data_ptr())


class _Registrations:
    """How many modules, parameters and buffers were registered on any module of the process since import: a global
    registration hook (nn.Module's setattr and register_* call them) counts each, so replacing a projection
    (quantization), a parameter or a buffer anywhere shows as a new count without walking the model."""

    count = 0

    @classmethod
    def seen(cls, module: nn.Module, name: str, value: object) -> None:  # returns None: registers `value` unchanged
        cls.count += 1


register_module_module_registration_hook(_Registrations.seen)
register_module_parameter_registration_hook(_Registrations.seen)
register_module_buffer_registration_hook(_Registrations.seen)


@dataclass(frozen=True)
class DecoderWatch:
    """What a built decoder depends on, checked every batch-1 step: whether the kernels are on, the model, no
    module, parameter or buffer registered since, the address of every weight, norm and bias the C layers read, and
    the caches. A reload copies into the same storage, which the C code reads in place; a replaced module or
    parameter is a registration; a weight's `.data` swapped for other storage moves its address. Every address, not
    the first layer's alone: a benchmark that stored the weights row-major and back had the first weight come back
    at its old address (the allocator reused it) and the other layers elsewhere, and the decoder read freed memory.

    The walk through the modules that finds those tensors runs when the watch is made, not per step: it cost
    ~0.4 ms inside a step on SmolLM2 (the step's weight stream evicts the ~1500 lines of module dicts it reads; 2%
    of an fp32 step, 6% of an int8 one). A step reads the kept tensors' addresses alone, in one C-level map."""

    kernels_on: bool
    model: nn.Module
    registrations: int
    tensors: tuple[torch.Tensor, ...]  # the weights, norms and biases as found: Parameters and buffers themselves
    addresses: list[int]
    caches: tuple[int, ...]

    @classmethod
    def of(cls, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> DecoderWatch:
        tensors = []
        for layer in model.layers:
            parts = layer._modules
            attn, mlp = parts["self_attn"]._modules, parts["mlp"]._modules
            for module in (attn["qkv_proj"], attn["o_proj"], mlp["gate_up_proj"], mlp["down_proj"],
                           parts["input_layernorm"], parts["post_attention_layernorm"]):
                tensors.append(_tensor(module, "weight", "weight_int8"))  # fp32, else int8 (a buffer)
            tensors.append(_tensor(attn["qkv_proj"], "bias"))
        found = tuple(t for t in tensors if t is not None)
        return cls(kernels() is not None, model, _Registrations.count, found,
                   list(map(torch.Tensor.data_ptr, found)), _cache_addresses(kv_caches))

    def holds(self, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        return (self.registrations == _Registrations.count and model is self.model
                and (kernels() is not None) == self.kernels_on
                and list(map(torch.Tensor.data_ptr, self.tensors)) == self.addresses
                and _cache_addresses(kv_caches) == self.caches)


def _cache_addresses(kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, ...]:
    return tuple(t.data_ptr() for kv in kv_caches for t in kv)


def _tensor(module: nn.Module, *names: str) -> torch.Tensor | None:
    """The module's first parameter or buffer of these names; None where it has none (no bias, or a layer the C
    kernels do not run, which builds no decoder)."""
    for name in names:
        found = module._parameters.get(name)
        found = module._buffers.get(name) if found is None else found
        if found is not None:
            return found
    return None
