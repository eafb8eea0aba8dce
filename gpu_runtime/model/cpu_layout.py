"""Weight layout for decode on CPU: fp32 nn.Linear weights stored column-major.

A decode step multiplies one activation row by every weight matrix (a GEMV), so its speed is how fast the weights
stream from memory. PyTorch's CPU `F.linear(x, w)` with a row-major [out, in] weight streams them slowly at batch 1
(MKL on these AMD cores); the same product with the weight stored [in, out] (x @ w_t, i.e. `w` a transposed view of
a contiguous [in, out] tensor) streams them faster. Measured on one thread over SmolLM2's shapes (538 MB of fp32
weights, outside the caches): 4.4-5.4 GB/s row-major, 6.6-7.3 GB/s column-major, against a copy at 11-17 GB/s
(bytes read + written). At 8-32 rows the two layouts are within ~10%; bench/bench_real_model.py measures the
engine both ways.

Products over these weights run through numpy's OpenBLAS where it is available, faster than MKL here
(gpu_runtime.model.cpu_blas.BlasLinear: each converted nn.Linear gets that class, a subclass with the same parameters).

Only the storage changes: every parameter keeps its [out, in] shape and values, so loading (`copy_` into narrowed
views), quantization, tied embeddings (one Parameter) and the CUDA path see the same model. bf16 weights keep the
row-major layout, whose kernel is the faster one there.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu_runtime.model.cpu_blas import BlasLinear


def wants_column_major(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2


@torch.no_grad()
def use_decode_layout(model: nn.Module) -> int:
    """Store every fp32 CPU nn.Linear weight column-major in place and make the module a BlasLinear; returns how
    many weights changed."""
    changed = 0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        weight = module.weight
        if wants_column_major(weight) and weight.is_contiguous():
            weight.data = weight.data.t().contiguous().t()  # same Parameter object: ties and optimizers hold
            changed += 1
        if wants_column_major(weight) and type(module) is nn.Linear:
            module.__class__ = BlasLinear  # same attributes and parameters; only forward differs
    return changed
