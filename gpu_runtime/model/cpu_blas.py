"""fp32 CPU linear layers through numpy's OpenBLAS instead of torch's MKL, above all the batch-1 decode GEMVs.

A batch-1 decode step is ~120 matrix-vector products whose weights stream from memory once each; their speed is
how close the kernel gets to the memory bandwidth. On this project's AMD EPYC cores (Zen 5, AVX-512) MKL, which
PyTorch's CPU build uses, streams SmolLM2's 538 MB of column-major fp32 weights at ~18 GB/s on one thread; the
OpenBLAS that numpy's wheels bundle (runtime-dispatched Zen/SkylakeX kernels) streams the same arrays at ~23 GB/s,
against a read-only sum at ~33 GB/s (bench/bench_real_model.py measures the engine both ways, side by side).
OpenBLAS was ahead at every row count measured over SmolLM2's shapes (thread CPU time, one thread, huge pages,
load average ~6): 1 row 23.8 vs 30.2 ms, 8 rows 60 vs 78, 64 rows 204 vs 268, 256 rows (a prefill chunk) 711 vs
859. MKL dispatches by CPU vendor; on Intel cores the gap may be nil, and the benchmark reports it per machine.

The product reads the weight's [in, out] storage (gpu_runtime.model.cpu_layout) as a numpy view, no copy: x @ W^T
with W^T row-major is `sgemv` (one row) or `sgemm` over the same bytes. Where cpu_kernels.c is built, one row goes
through its GEMV and two rows or more through its GEMM (where it runs AVX-512), each faster than OpenBLAS's here
(`_rows`); OpenBLAS is then the fallback. Results differ from MKL's only in summation order (fp32 rounding).

Used only where it is safe and measured: a CPU fp32 input, a column-major weight, no autograd, and one torch thread
(the runtime's default, one per process; with more, torch's threaded kernel runs). OpenBLAS is pinned to one thread
when the path is enabled: its own worker threads spin, and two of them on a shared 2-core machine ran the weights
10x slower. Where the OpenBLAS thread setter cannot be found (numpy built on another BLAS, not Linux), the path
stays off and torch's kernel runs, unchanged. CUDA, bf16 and the int8 layers that replace the module never get here.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gpu_runtime.model import cpu_kernels

ENV_SWITCH = "GPU_RUNTIME_NUMPY_BLAS"  # "0" turns the path off for the process
# Symbol spellings of OpenBLAS's thread functions: numpy's wheels (scipy-openblas, 64-bit ints) and plain builds.
_NAMES = (("scipy_openblas_", "64_"), ("scipy_openblas_", ""), ("openblas_", "64_"), ("openblas_", ""))


_state = {"enabled": os.environ.get(ENV_SWITCH, "1") != "0"}


def set_enabled(enabled: bool) -> bool:
    """Turn the path on or off for the process (the benchmark times torch's kernel side by side); returns the
    previous setting."""
    previous, _state["enabled"] = _state["enabled"], enabled
    return previous


def numpy_blas_ready() -> bool:
    return _state["enabled"] and _openblas_pinned()


@functools.cache
def _openblas_pinned() -> bool:
    """True once numpy's OpenBLAS is found and pinned to one thread (done once per process)."""
    lib = _openblas()
    if lib is None:
        return False
    setter = next(getattr(lib, f"{prefix}set_num_threads{suffix}") for prefix, suffix in _NAMES
                  if hasattr(lib, f"{prefix}set_num_threads{suffix}"))
    setter.argtypes = [ctypes.c_int]
    setter(1)
    return True


def openblas_threads() -> int | None:
    """OpenBLAS's thread count in this process, None where numpy's OpenBLAS is not found."""
    lib = _openblas()
    if lib is None:
        return None
    getter = next((getattr(lib, f"{prefix}get_num_threads{suffix}") for prefix, suffix in _NAMES
                   if hasattr(lib, f"{prefix}get_num_threads{suffix}")), None)
    return None if getter is None else int(getter())


@functools.cache
def _openblas() -> ctypes.CDLL | None:
    """The OpenBLAS that numpy loaded, found as threadpoolctl finds it (by the process' mapped libraries), if it has
    a known thread setter; None where there is none (numpy on another BLAS, no /proc)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if any(hasattr(lib, f"{prefix}set_num_threads{suffix}") for prefix, suffix in _NAMES):
            return lib
    return None


class BlasLinear(nn.Linear):
    """nn.Linear whose CPU fp32 products run through numpy's OpenBLAS (see the module docstring). Same parameters,
    state dict and isinstance as nn.Linear: gpu_runtime.model.cpu_layout swaps the class in place.

    The numpy view of the weight is made once and kept while the weight's storage stays the same (a reload copies
    into it): a decode step makes ~120 of these products, and rebuilding the view and re-checking the weight per call
    cost ~10 us each, a twentieth of the step.
    """

    _blas_weight: tuple[int, np.ndarray] | None = None  # (data_ptr of the [in, out] storage, its numpy view)

    def _numpy_weight(self) -> np.ndarray | None:
        weight = self.weight
        cached = self._blas_weight
        if cached is not None and cached[0] == weight.data_ptr():
            return cached[1]
        weight_t = weight.t()
        if not (weight_t.is_contiguous() and weight_t.dtype == torch.float32 and weight_t.device.type == "cpu"):
            self._blas_weight = None
            return None
        view = weight_t.detach().numpy()
        self._blas_weight = (weight.data_ptr(), view)
        return view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() and not torch.is_grad_enabled()
                and torch.get_num_threads() == 1 and numpy_blas_ready()):
            weight_t = self._numpy_weight()
            if weight_t is not None:
                rows = x.detach().reshape(-1, self.in_features).contiguous()
                y = _rows(rows, weight_t)
                if y is None:
                    vector = rows.shape[0] == 1  # one row: a GEMV (sgemv), where the C kernels are missing
                    out = np.matmul(rows.numpy()[0] if vector else rows.numpy(), weight_t)
                    y = torch.from_numpy(out)
                y = y.view(*x.shape[:-1], self.out_features)
                return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)


def _rows(rows: torch.Tensor, weight_t: np.ndarray) -> torch.Tensor | None:
    """rows @ weight_t through cpu_kernels.c where it runs; None elsewhere. One row (a batch-1 step's output head;
    its decoder layers run in C already, gpu_runtime.model.cpu_decode) takes `gemv_f32`, which streams SmolLM2's
    fp32 head (113 MB) faster than OpenBLAS's sgemv. Two rows or more (a batched decode step, a prefill chunk) take
    `gemm_f32_rows` where it runs AVX-512: OpenBLAS packs its panels on every call and its sgemm reached ~90 GFLOP/s
    here; over SmolLM2's shapes with the weights cold, as in a step, the kernel measured 1.9x it at 2 rows, 1.85x at
    16, 1.66x at 64, 1.56x at 128 and 1.34x at 2048."""
    lib = cpu_kernels.kernels()
    if lib is None:
        return None
    y = torch.empty(rows.shape[0], weight_t.shape[1])
    if rows.shape[0] == 1:
        lib.gemv_f32(rows.data_ptr(), weight_t.ctypes.data, weight_t.shape[0], weight_t.shape[1], y.data_ptr())
        return y
    if not lib.gemm_f32_rows_fast():
        return None
    lib.gemm_f32_rows(rows.data_ptr(), weight_t.ctypes.data, rows.shape[0], weight_t.shape[0], weight_t.shape[1],
                      y.data_ptr())
    return y
