"""int8 output head (and token embedding) with one scale per block of 32 inputs, llama.cpp's Q8_0 granularity.

The head turns the last hidden state into every token's logit, and its rounding reaches the logits undiluted; a row
of SmolLM2's tied embedding has a few large dimensions that set a per-row scale, so one scale per row rounds the
rest coarsely. Measured on SmolLM2-135M over the quality gate's probes, teacher-forced (the fp32 answers fed to both):
KL of int8 from fp32 0.0032 with the head in fp32, 0.0040 with it per row, 0.0032 with 32-input blocks (top-1
agreement 96.5-96.7% in all three). Blocks cost 4 bytes of scale per 32 int8 weights (the head reads 32 MB, not 28).

A row w[o, :] is stored as round(w[o, b] / s[o, b]) for each block b of 32 inputs with s[o, b] = max|w[o, b]| / 127;
a row whose length 32 does not divide is one block. On CPU with fp32 activations the product runs in
gpu_runtime/model/cpu_kernels.c (`gemm_i8_blocks`, the weight read once for all rows, fp32 sums); elsewhere (CUDA,
bf16, no C compiler) the weight is dequantized into the activation dtype inside the forward, DEQUANT_ROWS output rows
at a time: a whole dequantized head is a large transient (Llama-3-8B's: 1 GB in bf16) on a GPU whose free memory
went to the KV cache.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu_runtime.model.cpu_kernels import kernels
from gpu_runtime.quant.int8 import INT8_MAX, Int8Weights

BLOCK = 32
DEQUANT_ROWS = 8192  # output rows dequantized at once outside the C kernel (64 MB of bf16 at 4096 inputs)


def block_size(in_features: int) -> int:
    return BLOCK if in_features % BLOCK == 0 else in_features


def quantize_int8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of a [out, in] weight per block of inputs -> (w_int8 [out, in], scale [out, in / block] fp32)."""
    w = weight.detach().to(torch.float32).contiguous()  # row-major even where the model keeps it column-major
    out, size = w.shape[0], block_size(w.shape[1])
    blocks = w.view(out, -1, size)
    scale = blocks.abs().amax(dim=2).clamp(min=1e-12) / INT8_MAX  # [out, groups]
    w_int8 = torch.round(blocks / scale[:, :, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return w_int8.view_as(w), scale


def dequantize_blocks(w_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w_int8 [..., in] with scale [..., groups] -> the weight in scale's dtype."""
    blocks = w_int8.unflatten(-1, (scale.shape[-1], -1)).to(scale.dtype)
    return (blocks * scale.unsqueeze(-1)).flatten(-2)


class Int8BlockLinear(Int8Weights):
    """Drop-in for nn.Linear whose weight is int8 with a scale per block of inputs (see the module docstring)."""

    quantize = staticmethod(quantize_int8_blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._c_product(x)
        if y is None:
            y = torch.cat([nn.functional.linear(x, dequantize_blocks(q, s.to(x.dtype))) for q, s in zip(
                self.weight_int8.split(DEQUANT_ROWS), self.scale.split(DEQUANT_ROWS), strict=True)], dim=-1)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def _c_product(self, x: torch.Tensor) -> torch.Tensor | None:
        """x @ W^T through the C kernel, None where it does not run (not CPU fp32, no kernels)."""
        ok = x.device.type == "cpu" and x.dtype == self.scale.dtype == torch.float32 and not x.requires_grad
        lib = kernels() if ok and self.weight_int8.is_contiguous() else None
        if lib is None:
            return None
        rows = x.detach().reshape(-1, self.in_features).contiguous()
        y = torch.empty(rows.shape[0], self.out_features)
        lib.gemm_i8_blocks(rows.data_ptr(), self.weight_int8.data_ptr(), self.scale.data_ptr(), rows.shape[0],
                           self.in_features, self.out_features, self.in_features // self.scale.shape[1], y.data_ptr())
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"block={self.in_features // self.scale.shape[1]}")
