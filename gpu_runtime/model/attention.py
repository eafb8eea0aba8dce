"""Rotary embeddings and attention over the paged KV cache.

The KV cache of one layer is a pair of head-major tensors [num_kv_heads, num_blocks * block_size, head_dim]; a token's
slot is block_id * block_size + offset. Each step writes the new tokens' K/V into their slots, then attends per group:
- a "batched" group: many sequences with few query tokens each (decode, or speculative verification); their active
  blocks are gathered into one padded [kv_heads, B, S, head_dim] tensor and attended with two bmm calls and a mask;
- a "prefill" group: one sequence with a long chunk; without earlier context it attends to its own K/V with a causal
  SDPA (flash/efficient kernels on CUDA, the fused CPU kernel elsewhere), otherwise it gathers its blocks.
Pure PyTorch, so it runs anywhere; torch's SDPA picks fused kernels on CUDA. On CPU in fp32, a batched group of plain
decode (one query a sequence) attends through the C kernels over the block tables in place, no gather
(gpu_runtime.model.cpu_attention), where they are built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu_runtime.config import ModelConfig, RopeScaling
from gpu_runtime.model import cpu_attention


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies, with Llama 3.1 scaling as in Meta's reference (llama-models, apply_scaling), then
    divided by llama.cpp's per-frequency factors where a GGUF file carries them."""
    inv_freq = _scaled_inv_freq(head_dim, theta, scaling)
    if not scaling.freq_factors:
        return inv_freq
    if len(scaling.freq_factors) != head_dim // 2:
        raise ValueError(f"rope_freqs has {len(scaling.freq_factors)} factors; head_dim {head_dim} needs "
                         f"{head_dim // 2}")
    return inv_freq / torch.tensor(scaling.freq_factors, dtype=torch.float32)


def _scaled_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type != "llama3":
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


@dataclass(frozen=True)
class RopeTables:
    """cos/sin for every position up to max_len, [max_len, head_dim] each, already in the model dtype.

    `sin` carries rotate_half's sign: its first half is negated, so apply_rope needs no negation per layer and step
    ((-a) * b == a * (-b) exactly, so the result is HF's bit for bit).
    """

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def build(cls, cfg: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> RopeTables:
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # HF's non-interleaved layout: [max_len, head_dim]
        signed = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
        return cls(cos=emb.cos().to(device=device, dtype=dtype), sin=signed.to(device=device, dtype=dtype))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, 1, head_dim] gathered at the tokens' positions (sin signed, see
    RopeTables). HF's x * cos + rotate_half(x) * sin with rotate_half = cat(-x2, x1)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class AttentionGroup:
    """Tokens [start, end) of the flat batch that share one attention call.

    block_tables: [B, max_blocks] (None for a fresh prefill that needs no cached context);
    mask: [1, 1, n, S] bool (True = may attend) for a prefill chunk with earlier context, else None;
    bias: [1, B, 1, max_q, S] float (0 or -inf) for the batched group, else None;
    num_keys: for a batched group of one sequence with one query (batch-1 decode), how many slots it attends to
      (its whole context, so no bias is needed: the step builds no mask and adds none), else 0;
    key_slot: for batch-1 decode whose blocks lie side by side in the pool (a fresh pool's case: the free list
      hands out ascending ids; churn scatters them later), the slot of its first key: its K/V are then a slice of
      the cache, no gather and no tables;
      else -1;
    num_queries: queries per sequence when uniform, else 0;
    pad_index: [B * max_q] positions (relative to start) that fill the padded queries when not uniform;
    valid_index: [end - start] rows of the padded [B * max_q] output that are real tokens;
    seq_keys: for a batched group of one query a sequence (plain decode), [B] int64 keys each attends to (its
      position + 1), on the CPU, with the largest in most_keys: the C path attends over the block tables with them
      (gpu_runtime.model.cpu_attention); else None.
    """

    start: int
    end: int
    num_seqs: int
    block_tables: torch.Tensor | None
    mask: torch.Tensor | None
    num_queries: int
    bias: torch.Tensor | None = None
    num_keys: int = 0
    pad_index: torch.Tensor | None = None
    valid_index: torch.Tensor | None = None
    key_slot: int = -1
    seq_keys: torch.Tensor | None = None
    most_keys: int = 0


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step inputs to attention, shared by all layers: where new K/V go, and how tokens are grouped."""

    slot_mapping: torch.Tensor  # [T] long
    groups: tuple[AttentionGroup, ...]
    block_size: int


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store the step's K/V [T, kv_heads, head_dim] in their slots of the [kv_heads, num_slots, head_dim] caches."""
    k_cache.index_copy_(1, slots, k.transpose(0, 1))
    v_cache.index_copy_(1, slots, v.transpose(0, 1))


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """[kvh, num_slots, d] cache + [B, nb] tables -> [kvh, B, nb * block_size, d], the active blocks only.

    Head-major, so the result feeds bmm as [kvh * B, S, d] without another copy; index_select, not advanced
    indexing: ~10x faster on CPU.
    """
    kvh, num_slots, d = cache.shape
    blocks = cache.view(kvh, num_slots // block_size, block_size, d).index_select(1, block_tables.view(-1))
    b, nb = block_tables.shape
    return blocks.view(kvh, b, nb * block_size, d)


def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """One sequence: q [n, H, d], k/v [1, kvh, S, d]; causal when mask is None (S == n). Returns [n, H, d]."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out[0].transpose(0, 1)


def batched_attention_bmm(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """q [B, Q, H, d], keys/values [kvh, B, S, d], bias [1, B, 1, Q, S] (0 or -inf; None: every key) -> [B, Q, H, d].

    Two bmm calls with the query heads of a KV group stacked as rows: on CPU this beats SDPA's per-head kernel
    several times at decode shapes, and GQA needs no repeated K/V. In bf16/fp16 the scores come out of bmm in that
    dtype (as in HF's eager attention) before the fp32 softmax; fp32 models are exact.
    """
    b, nq, h, d = q.shape
    kvh, s = keys.shape[0], keys.shape[2]
    g = h // kvh
    qg = q.view(b, nq, kvh, g, d).permute(2, 0, 3, 1, 4).reshape(kvh * b, g * nq, d)
    scores = torch.bmm(qg, keys.view(kvh * b, s, d).transpose(1, 2)).view(kvh, b, g, nq, s)
    scaled = scores.float() * d**-0.5
    probs = (scaled if bias is None else scaled + bias).softmax(dim=-1).to(values.dtype).view(kvh * b, g * nq, s)
    out = torch.bmm(probs, values.view(kvh * b, s, d))  # [kvh * B, g * Q, d]
    return out.view(kvh, b, g, nq, d).permute(1, 3, 0, 2, 4).reshape(b, nq, h, d)


def decode_attention_bmm(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One query token: q [1, H, d], keys/values [kvh, S, d] -> [1, H, d]. batched_attention_bmm's products for
    B = Q = 1 (the same bmm shapes, so the same values bit for bit) without its permutes and copies, and in fp32
    without the casts: ~20 us a layer instead of ~70 on CPU."""
    h, d = q.shape[1], q.shape[2]
    kvh = keys.shape[0]
    scores = torch.bmm(q.view(kvh, h // kvh, d), keys.transpose(1, 2))  # [kvh, g, S]
    if scores.dtype == torch.float32:
        probs = (scores * d**-0.5).softmax(dim=-1)
    else:
        probs = (scores.float() * d**-0.5).softmax(dim=-1).to(values.dtype)
    return torch.bmm(probs, values).view(1, h, d)


def batched_attention_sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as batched_attention_bmm, through SDPA: on CUDA its fused kernels keep scores in fp32."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=None if bias is None else bias[0].to(q.dtype),
        enable_gqa=q.shape[2] != keys.shape[0],
    )  # [B, H, Q, d]
    return out.transpose(1, 2)


def _attend_group(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    g: AttentionGroup,
    block_size: int,
) -> torch.Tensor:
    """Attention for the group's tokens; returns [end - start, heads, head_dim]."""
    qg = q[g.start : g.end]
    if g.key_slot >= 0:  # batch-1 decode over contiguous blocks: its keys are a slice of the cache
        end = g.key_slot + g.num_keys
        keys, values = k_cache[:, g.key_slot : end], v_cache[:, g.key_slot : end]
        if qg.is_cuda:
            return batched_attention_sdpa(qg[None], keys[:, None], values[:, None], None)[0]
        return decode_attention_bmm(qg, keys, values)
    if g.block_tables is None:  # fresh prefill of one sequence: only its own tokens
        own_k, own_v = k[g.start : g.end].transpose(0, 1)[None], v[g.start : g.end].transpose(0, 1)[None]
        return _prefill_attention(qg, own_k, own_v, None)
    if g.seq_keys is not None and not qg.is_cuda:
        out = cpu_attention.decode_attention(qg, k_cache, v_cache, g.block_tables, g.seq_keys, g.most_keys,
                                             block_size)
        if out is not None:
            return out
    keys = _gather(k_cache, g.block_tables, block_size)
    values = _gather(v_cache, g.block_tables, block_size)
    if g.mask is not None:  # one long prefill chunk continuing earlier context
        return _prefill_attention(qg, keys.transpose(0, 1), values.transpose(0, 1), g.mask[0])
    heads, dim = qg.shape[1], qg.shape[2]
    if g.num_keys:  # batch-1 decode: exactly the sequence's slots, no mask
        keys, values = keys[:, :, : g.num_keys], values[:, :, : g.num_keys]
    if g.num_queries:
        qb = qg.view(g.num_seqs, g.num_queries, heads, dim)
    else:
        assert g.pad_index is not None
        qb = qg.index_select(0, g.pad_index).view(g.num_seqs, -1, heads, dim)
    attend = batched_attention_sdpa if qb.is_cuda else batched_attention_bmm
    out = attend(qb, keys, values, g.bias).reshape(-1, heads, dim)
    return out if g.num_queries else out.index_select(0, g.valid_index)  # type: ignore[arg-type]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """q: [T, H, d]; k, v: [T, kvh, d]. Writes k/v into the cache, returns [T, H, d]."""
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    if len(meta.groups) == 1:
        return _attend_group(q, k, v, k_cache, v_cache, meta.groups[0], meta.block_size)
    return torch.cat([_attend_group(q, k, v, k_cache, v_cache, g, meta.block_size) for g in meta.groups])
