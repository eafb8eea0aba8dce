"""Swap a model's nn.Linear and nn.Embedding layers for quantized ones, undo it, and account for weight memory.

`quantize_model` replaces the nn.Linear layers of the decoder by Int8Linear or Fp8Linear in place. Whether the token
embedding and the output head are quantized too depends on the scheme. fp8 keeps them in the model's dtype, as
vLLM does: their per-row rounding reaches the logits undiluted (measured on a small trained model,
tests/runtime/test_quant.py: mean logit error 0.66% and 99.5% top-1 agreement with them, 0.44% and 100% without).
int8 quantizes them, as llama.cpp's Q8_0 does, with one scale per block of 32 inputs (gpu_runtime.quant.int8_blocks,
where the effect on SmolLM2's logits is measured), where the C kernels run the head's product (an fp32 model on CPU
with a C compiler): on a small model the head is a large share of the bytes a decode step reads (SmolLM2-135M: 113
of 220 MB with the head in fp32), so a CPU int8 step otherwise streams mostly fp32. Elsewhere (CUDA, bf16, no
compiler) an int8 head would be dequantized every step, which reads more than the full-precision head it replaces
(and cost the PyTorch CPU path 60 ms a token on SmolLM2), so there they stay in the model's dtype.
`quantize_embeddings` overrides the scheme's choice. A weight shared by several modules (tied embeddings) is
quantized once and shared, or left alone when only one of its users would be. Switching schemes live never
quantizes twice: `requantize` turns quantized layers back into empty full-precision shells, lets the engine's
loader refill them from the checkpoint, then quantizes again, so every scheme starts from the original weights.
Weight bytes are counted over unique tensor storages, so tied embeddings count once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import nn

from gpu_runtime.model.cpu_kernels import kernels
from gpu_runtime.quant.embedding import QuantizedEmbedding
from gpu_runtime.quant.fp8 import Fp8Linear, check_fp8_supported, quantize_fp8_per_channel
from gpu_runtime.quant.int8 import Int8Linear, quantize_int8_per_channel
from gpu_runtime.quant.int8_blocks import Int8BlockLinear, quantize_int8_blocks

QUANTIZED_TYPES = (Int8Linear, Int8BlockLinear, Fp8Linear, QuantizedEmbedding)
OUTPUT_HEAD_NAMES = ("lm_head",)
Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class QuantScheme(StrEnum):
    NONE = "none"
    INT8 = "int8"
    FP8 = "fp8"


def parse_scheme(value: str | None) -> QuantScheme:
    """'none' | 'int8' | 'fp8' (None means none); anything else is a ValueError naming the choices."""
    text = "none" if value is None else value.strip().lower()
    try:
        return QuantScheme(text)
    except ValueError:
        choices = ", ".join(s.value for s in QuantScheme)
        raise ValueError(f"unsupported quantization {value!r}; choose one of: {choices}") from None


@dataclass(frozen=True)
class QuantReport:
    """Weight memory around one quantization change."""

    scheme: QuantScheme
    weight_bytes_before: int  # the model as it was before this change
    weight_bytes_after: int
    num_modules_quantized: int

    @property
    def ratio(self) -> float:
        return self.weight_bytes_after / self.weight_bytes_before


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and persistent buffers, each storage counted once (tied weights share storage)."""
    seen: set[int] = set()
    total = 0
    for tensor in model.state_dict(keep_vars=True).values():
        if tensor is None or tensor.device.type == "meta":
            continue
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


def _children_of_type(model: nn.Module, types: tuple[type[nn.Module], ...]) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, child) for each child of one of `types`, listed before any swap."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, types)
    ]


def _model_device(model: nn.Module) -> torch.device:
    return next(iter(model.state_dict().values())).device


def _model_dtype(model: nn.Module) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


class _SharedQuantizer:
    """Quantizes each distinct weight tensor once, so tied modules end up sharing one quantized tensor."""

    def __init__(self, quantize: Quantizer):
        self._quantize = quantize
        self._done: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if id(weight) not in self._done:
            self._done[id(weight)] = self._quantize(weight)
        return self._done[id(weight)]


def _targets(model: nn.Module, quantize_embeddings: bool) -> list[tuple[nn.Module, str, nn.Module]]:
    """The modules to quantize: decoder linears, plus the embedding and output head when asked to."""
    found = _children_of_type(model, (nn.Linear, nn.Embedding))
    if quantize_embeddings:
        return found
    output_weights = {id(c.weight) for _, name, c in found if name in OUTPUT_HEAD_NAMES or isinstance(c, nn.Embedding)}
    return [(p, n, c) for p, n, c in found if id(c.weight) not in output_weights]


def _swap(module: nn.Module, name: str, scheme: QuantScheme, layers: _SharedQuantizer,
          tables: _SharedQuantizer) -> nn.Module:
    """The quantized module for `module`; the embedding and the output head (tables) may use their own quantizer."""
    table = isinstance(module, nn.Embedding) or name in OUTPUT_HEAD_NAMES
    w_q, scale = (tables if table else layers)(module.weight)
    if isinstance(module, nn.Embedding):
        return QuantizedEmbedding(w_q, scale, module.weight.dtype, module.padding_idx)
    if scheme is QuantScheme.INT8:
        layer_type: type[nn.Module] = Int8BlockLinear if table else Int8Linear
    else:
        layer_type = Fp8Linear
    return layer_type(w_q, scale, module.bias, module.weight.dtype)


@torch.no_grad()
def quantize_model(model: nn.Module, scheme: QuantScheme | str, quantize_embeddings: bool | None = None
                   ) -> QuantReport:
    """Replace full-precision layers by quantized ones in place (see the module docstring); 'none' changes nothing.
    quantize_embeddings None: the scheme's choice (`quantizes_embeddings`)."""
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if quantize_embeddings is None:
        quantize_embeddings = quantizes_embeddings(scheme, _model_device(model), _model_dtype(model))
    before = weight_bytes(model)
    if scheme is QuantScheme.NONE:
        return QuantReport(scheme, before, before, 0)
    if scheme is QuantScheme.FP8:
        check_fp8_supported(_model_device(model))
    int8 = scheme is QuantScheme.INT8
    layers = _SharedQuantizer(quantize_int8_per_channel if int8 else quantize_fp8_per_channel)
    tables = _SharedQuantizer(quantize_int8_blocks) if int8 else layers
    targets = _targets(model, quantize_embeddings)
    for parent, name, child in targets:
        setattr(parent, name, _swap(child, name, scheme, layers, tables))
    return QuantReport(scheme, before, weight_bytes(model), len(targets))


def quantizes_embeddings(scheme: QuantScheme, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `scheme` quantizes the token embedding and output head by default: int8, where the C kernels run the
    head's product (see the module docstring)."""
    return scheme is QuantScheme.INT8 and device.type == "cpu" and dtype == torch.float32 and kernels() is not None


def _shell(module: nn.Module) -> nn.Module:
    """An uninitialised full-precision module of the quantized module's shape, dtype and device."""
    device, dtype = module.scale.device, module.scale.dtype
    if isinstance(module, QuantizedEmbedding):
        return nn.Embedding(
            module.num_embeddings, module.embedding_dim, module.padding_idx, device=device, dtype=dtype
        )
    return nn.Linear(module.in_features, module.out_features, module.bias is not None, device=device, dtype=dtype)


def dequantize_to_shells(model: nn.Module) -> int:
    """Replace quantized modules by uninitialised full-precision ones; returns how many.

    The shells hold garbage until the caller reloads the checkpoint into them (and re-ties shared weights).
    """
    targets = _children_of_type(model, QUANTIZED_TYPES)
    for parent, name, child in targets:
        setattr(parent, name, _shell(child))
    return len(targets)


@torch.no_grad()
def requantize(
    model: nn.Module, scheme: QuantScheme | str, reload_weights: Callable[[nn.Module], None],
    quantize_embeddings: bool | None = None,
) -> QuantReport:
    """Switch the model to `scheme` from the original checkpoint weights, whatever scheme it runs now.

    `reload_weights(model)` must copy the checkpoint's tensors into the model's full-precision modules and re-tie
    weights the model shares (the engine's loader does both).
    """
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if scheme is QuantScheme.FP8:
        check_fp8_supported(_model_device(model))  # refuse before touching the model
    before = weight_bytes(model)
    if dequantize_to_shells(model):
        reload_weights(model)
    report = quantize_model(model, scheme, quantize_embeddings)
    return QuantReport(scheme, before, report.weight_bytes_after, report.num_modules_quantized)
