"""Decode attention of a batched step on CPU through the C kernels, over each sequence's block table in place.

A batched decode step (several sequences, one new token each) attends per layer. The PyTorch path
(gpu_runtime.model.attention) gathers every sequence's blocks into one padded [kv_heads, B, S, head_dim] copy per
layer, masks the padding and runs two bmm calls; at 32 sequences on SmolLM2 the gathers, products and mask took
~12 ms of a ~97 ms step. cpu_kernels.c's `attend_decode_batch` walks each sequence's own blocks where they lie, the
loop the C batch-1 decoder runs (gpu_runtime.model.cpu_decode), so the two paths attend alike. fp32 CPU tensors only;
anything else, or no kernels, returns None and the PyTorch path runs.
"""

from __future__ import annotations

import torch

from gpu_runtime.model.cpu_kernels import kernels


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_keys: torch.Tensor, most_keys: int, block_size: int) -> torch.Tensor | None:
    """q [B, heads, d] (one query a sequence); caches [kv_heads, num_slots, d]; block_tables [B, max_blocks] int64;
    seq_keys [B] int64, the keys each sequence attends to (its position + 1), the largest `most_keys`. Returns
    [B, heads, d], or None where the C path does not run."""
    lib = kernels()
    if lib is None or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in (q, k_cache, v_cache)) or \
            not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None
    q, tables, keys = q.contiguous(), block_tables.contiguous(), seq_keys.contiguous()  # q: a view of the qkv rows
    num_seqs, heads, d = q.shape
    kv_heads, num_slots = k_cache.shape[0], k_cache.shape[1]
    out = torch.empty_like(q)
    scores = torch.empty(heads // kv_heads * most_keys)
    lib.attend_decode_batch(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), num_slots, tables.data_ptr(),
                            tables.shape[1], keys.data_ptr(), num_seqs, block_size, heads, kv_heads, d,
                            scores.data_ptr(), out.data_ptr())
    return out
