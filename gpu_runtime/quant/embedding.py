"""Embedding table stored quantized per row (per token), looked up and dequantized on the fly.

The token embedding is as large as the output head, so leaving it in full precision caps the saving of a
weight-only scheme well above half of bf16 bytes. Rows are quantized with the same per-row quantizer as the linear
layers (int8 or e4m3), or per block of 32 dimensions (int8, gpu_runtime.quant.int8_blocks: the granularity of the
int8 output head), which lets a tied output head share the quantized table instead of holding a second copy.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu_runtime.quant.int8_blocks import dequantize_blocks


class QuantizedEmbedding(nn.Module):
    """Drop-in for nn.Embedding: weight_q [num_embeddings, dim] (int8 or fp8) with one scale per row ([vocab]) or
    per block of each row ([vocab, blocks])."""

    def __init__(self, weight_q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, padding_idx: int | None = None):
        super().__init__()
        self.num_embeddings = int(weight_q.shape[0])
        self.embedding_dim = int(weight_q.shape[1])
        self.padding_idx = padding_idx
        self.register_buffer("weight_q", weight_q)  # [vocab, dim]
        self.register_buffer("scale", scale.to(dtype))  # [vocab] or [vocab, blocks]

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.scale.dim() == 2:
            return dequantize_blocks(self.weight_q[token_ids], self.scale[token_ids])
        rows = self.weight_q[token_ids].to(self.scale.dtype)  # [..., dim]
        return rows * self.scale[token_ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, storage={self.weight_q.dtype}"
