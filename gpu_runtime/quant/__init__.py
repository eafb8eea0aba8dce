"""Weight quantization for the runtime's models: int8 weight-only (CPU and CUDA) and fp8 e4m3 (CUDA >= sm_89)."""

from gpu_runtime.quant.apply import (
    QuantReport,
    QuantScheme,
    parse_scheme,
    quantize_model,
    requantize,
    weight_bytes,
)
from gpu_runtime.quant.embedding import QuantizedEmbedding
from gpu_runtime.quant.fp8 import Fp8Linear, Fp8UnsupportedError, check_fp8_supported
from gpu_runtime.quant.int8 import Int8Linear
from gpu_runtime.quant.int8_blocks import Int8BlockLinear

__all__ = [
    "Fp8Linear",
    "Fp8UnsupportedError",
    "Int8BlockLinear",
    "Int8Linear",
    "QuantReport",
    "QuantScheme",
    "QuantizedEmbedding",
    "check_fp8_supported",
    "parse_scheme",
    "quantize_model",
    "requantize",
    "weight_bytes",
]
