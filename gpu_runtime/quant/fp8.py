"""FP8 (e4m3) weight linear layer with one float scale per output channel, for CUDA GPUs that have fp8.

Weights are stored as float8_e4m3fn with s[o] = max|w[o, :]| / 448 (448 is e4m3's largest finite value, OCP FP8
spec / Micikevicius et al. 2022, "FP8 Formats for Deep Learning"), halving bf16 weight bytes. The matmul dequantizes
the fp8 weight to the activation dtype and applies the scale on the output (weight-only, like vLLM's fp8 Marlin path
on GPUs without fp8 tensor cores). fp8 storage needs compute capability 8.9 (Ada) or newer; elsewhere
`check_fp8_supported` raises `Fp8UnsupportedError` saying why, instead of silently running something else.
"""

from __future__ import annotations

import torch
from torch import nn

FP8_E4M3_MAX = 448.0
FP8_MIN_CAPABILITY = (8, 9)


class Fp8UnsupportedError(ValueError):
    """fp8 weights were asked for on a device that cannot run them (a configuration error, hence a ValueError)."""


def check_fp8_supported(device: torch.device) -> None:
    """Raise Fp8UnsupportedError unless `device` is a CUDA GPU of compute capability >= 8.9."""
    if not hasattr(torch, "float8_e4m3fn"):
        raise Fp8UnsupportedError(f"fp8 quantization needs torch.float8_e4m3fn; torch {torch.__version__} lacks it")
    if device.type != "cuda":
        raise Fp8UnsupportedError(
            f"fp8 quantization runs on CUDA GPUs of compute capability >= 8.9 only; this engine runs on {device.type} "
            "(use --quantization int8 there)"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise Fp8UnsupportedError(
            f"fp8 quantization needs compute capability >= 8.9 (Ada/Hopper); {name} has {capability[0]}.{capability[1]}"
        )


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantization of a [out, in] weight -> (w_fp8 [out, in], scale [out] float32)."""
    w = weight.detach().to(torch.float32).contiguous()  # row-major even where the model keeps it column-major
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_E4M3_MAX  # [out]
    w_fp8 = (w / scale[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return w_fp8, scale


class Fp8Linear(nn.Module):
    """Drop-in for nn.Linear whose weight is float8_e4m3fn with a float scale per output channel.

    Build it with `from_linear`, which checks the device; the constructor itself only stores tensors, so the
    dequantizing forward can be checked numerically anywhere.
    """

    def __init__(self, w_fp8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.in_features = int(w_fp8.shape[1])
        self.out_features = int(w_fp8.shape[0])
        self.register_buffer("weight_fp8", w_fp8)  # [out, in] e4m3
        self.register_buffer("scale", scale.to(dtype))  # [out]
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        check_fp8_supported(linear.weight.device)
        w_fp8, scale = quantize_fp8_per_channel(linear.weight)
        return cls(w_fp8, scale, linear.bias, linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight_fp8.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
