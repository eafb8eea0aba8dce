"""Build and load the runtime's C kernels for batch-1 decode on CPU (gpu_runtime/model/cpu_kernels.c).

The library is compiled once per source and machine with the system C compiler (`cc`, `-O3 -march=native`: the
kernels use AVX2 where the CPU has it) into the user's cache folder, then loaded with ctypes; later processes load
the cached file. The flags let the compiler reorder fp32 sums (vectorised dot products), never flush or drop
values. Where no compiler is found, the build fails or GPU_RUNTIME_CPU_KERNELS=0 is set, `kernels()` is None and the
runtime keeps its PyTorch path: the kernels are a speed-up, never a requirement.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

ENV_SWITCH = "GPU_RUNTIME_CPU_KERNELS"  # "0" keeps the PyTorch path for the process
SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
         "-fno-trapping-math", "-shared", "-fPIC")
_state = {"enabled": os.environ.get(ENV_SWITCH, "1") != "0"}


def set_enabled(enabled: bool) -> bool:
    """Turn the kernels on or off for the process (tests and the benchmark compare both); returns the previous."""
    previous, _state["enabled"] = _state["enabled"], enabled
    return previous


def kernels() -> ctypes.CDLL | None:
    """The loaded kernel library, or None where it is switched off or cannot be built."""
    return _load() if _state["enabled"] else None


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "slotune" / "kernels"


def _library_path() -> Path:
    """Keyed by source, flags and CPU: an edit, or a cache folder shared with a CPU of other instruction sets
    (`-march=native` code can fault there), builds anew."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + platform.machine().encode()
                         + _cpu_features().encode())
    return _cache_dir() / f"cpu_kernels-{key.hexdigest()[:16]}.so"


def _cpu_features() -> str:
    """The CPU's model and instruction-set flags as Linux reports them (empty elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return "".join(dict.fromkeys(line for line in lines if line.startswith(("flags", "model name"))))


@functools.cache
def _load() -> ctypes.CDLL | None:
    if not SOURCE.exists():  # an install that left the C source out
        return None
    target = _library_path()
    if not target.exists() and not _build(target):
        return None
    try:
        return _declare(ctypes.CDLL(str(target)))
    except OSError:
        return None


def _build(target: Path) -> bool:
    """Compile into a temporary file, then rename: processes building at once never load half a file."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            built = Path(tmp.name)
        subprocess.run([compiler, *FLAGS, "-o", str(built), str(SOURCE), "-lm"], check=True, capture_output=True,
                       timeout=120)
        built.replace(target)
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    lib.gemv_f32.argtypes = [ptr, ptr, i32, i32, ptr]
    lib.gemv_i8.argtypes = [ptr, ptr, ptr, i32, i32, ptr]
    lib.gemm_i8_blocks.argtypes = [ptr, ptr, ptr, i32, i32, i32, i32, ptr]
    lib.gemm_f32_rows.argtypes = [ptr, ptr, i32, i32, i32, ptr]
    lib.gemm_f32_rows_fast.argtypes = []
    lib.gemm_f32_rows_fast.restype = i32
    lib.rms_norm.argtypes = [ptr, ptr, f32, i32, ptr]
    lib.decode_layers.argtypes = [ptr, i32, ptr, ptr, ptr, ptr, i64, ptr, i32, i64, ptr]
    lib.attend_decode_batch.argtypes = [ptr, ptr, ptr, i64, ptr, i32, ptr, i32, i32, i32, i32, i32, ptr, ptr]
    for name in ("gemv_f32", "gemv_i8", "gemm_i8_blocks", "gemm_f32_rows", "rms_norm", "decode_layers",
                 "attend_decode_batch"):
        getattr(lib, name).restype = None
    return lib


class Layer(ctypes.Structure):
    """cpu_kernels.c's Layer: one decoder layer's weight, norm and KV cache addresses."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "qkv", "o", "gate_up", "down", "qkv_scale", "o_scale", "gate_up_scale", "down_scale", "qkv_bias",
        "input_norm", "post_norm", "k_cache", "v_cache")]


class Shape(ctypes.Structure):
    """cpu_kernels.c's Shape: the model's dimensions and the KV cache's slots per head."""

    _fields_ = [("hidden", ctypes.c_int), ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("intermediate", ctypes.c_int), ("eps", ctypes.c_float),
                ("num_slots", ctypes.c_long)]
