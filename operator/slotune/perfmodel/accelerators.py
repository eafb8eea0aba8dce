"""Accelerator profiles: the physical limits (bandwidth, peak FLOP/s, memory) the roofline model works from.

Datasheet numbers come from docs/facts.md#gpu (dense, no sparsity). The achieved fractions and per-step
overheads are priors: calibration (`slotune.perfmodel.calibration`) refits them from measured step times. `cpu` is the
2-core development machine of docs/facts.md#cpu, where eager PyTorch is overhead-bound (~10 us per op, ~0.25 ms
per decoder layer per step at batch 1), so its profile carries a large per-layer cost next to the fixed step cost.
"""

from __future__ import annotations

from dataclasses import dataclass

TB = 1e12
GB = 1e9


@dataclass(frozen=True)
class AcceleratorProfile:
    """One device's limits and the priors for how close a serving engine gets to them."""

    name: str
    memory_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    memory_bytes: float
    fp8_flops_per_s: float | None = None  # None: no fp8 tensor cores, fp8/int8 weights are dequantized to bf16
    fp32_flops_per_s: float | None = None  # only where fp32 serving is realistic (cpu)
    interconnect_bytes_per_s: float = 300 * GB  # per direction, for tensor-parallel all-reduce
    bandwidth_efficiency: float = 0.77  # vLLM reaches ~77% of the bound on A100-40 at concurrency 1 (reference s.4)
    compute_efficiency: float = 0.6
    step_overhead_s: float = 0.0004  # scheduling, sampling, kernel launches per engine step
    layer_overhead_s: float = 0.0  # per decoder layer per step (significant only for eager CPU execution)
    # Host-side linear terms of the roofline (see slotune.perfmodel.roofline); 0 on GPUs, where they hide under the
    # bandwidth and launch terms, measured on CPU where the eager engine pays them per sequence and per token.
    seq_overhead_s: float = 0.0
    prefill_seq_overhead_s: float = 0.0
    new_seq_overhead_s: float = 0.0
    decode_context_token_s: float = 0.0
    prefill_attention_pair_s: float = 0.0
    prefill_context_pair_s: float = 0.0

    def peak_flops_per_s(self, weight_bytes_per_param: float) -> float:
        """Peak matmul rate for weights of that width: 8-bit weights use fp8 tensor cores where they exist."""
        if weight_bytes_per_param <= 1 and self.fp8_flops_per_s is not None:
            return self.fp8_flops_per_s
        if weight_bytes_per_param >= 4 and self.fp32_flops_per_s is not None:
            return self.fp32_flops_per_s
        return self.bf16_flops_per_s

    @property
    def ridge_tokens(self) -> float:
        """Tokens per step where decode turns compute bound: peak FLOP/s / bandwidth (H100 ~295, reference s.4)."""
        return self.bf16_flops_per_s / self.memory_bandwidth_bytes_per_s


ACCELERATORS: dict[str, AcceleratorProfile] = {
    p.name: p
    for p in (
        AcceleratorProfile("nvidia-h200", 4.8 * TB, 989 * TB, 141 * GB, fp8_flops_per_s=1979 * TB,
                           interconnect_bytes_per_s=450 * GB),
        AcceleratorProfile("nvidia-h100-80gb", 3.35 * TB, 989 * TB, 80 * GB, fp8_flops_per_s=1979 * TB,
                           interconnect_bytes_per_s=450 * GB),
        AcceleratorProfile("nvidia-h100-pcie", 2.0 * TB, 756 * TB, 80 * GB, fp8_flops_per_s=1513 * TB,
                           interconnect_bytes_per_s=64 * GB),
        AcceleratorProfile("nvidia-a100-80gb", 2.04 * TB, 312 * TB, 80 * GB),
        AcceleratorProfile("nvidia-a100-40gb", 1.56 * TB, 312 * TB, 40 * GB),
        AcceleratorProfile("nvidia-l4", 0.30 * TB, 121 * TB, 24 * GB, fp8_flops_per_s=242 * TB,
                           interconnect_bytes_per_s=32 * GB),
        # docs/facts.md#cpu: ~30 GB/s read, bf16 matmul ~400 GFLOP/s (AMX/AVX-512), fp32 ~165 GFLOP/s, eager overheads.
        AcceleratorProfile("cpu", 30 * GB, 400e9, 16 * GB, fp32_flops_per_s=165e9, interconnect_bytes_per_s=10 * GB,
                           bandwidth_efficiency=0.6, compute_efficiency=0.5, step_overhead_s=0.002,
                           layer_overhead_s=0.00025),
    )
}

# Short names people write in specs.
_ALIASES = {"h200": "nvidia-h200", "h100": "nvidia-h100-80gb", "nvidia-h100": "nvidia-h100-80gb",
            "a100": "nvidia-a100-80gb", "nvidia-a100": "nvidia-a100-80gb", "a100-40gb": "nvidia-a100-40gb",
            "l4": "nvidia-l4"}


def accelerator(name: str) -> AcceleratorProfile:
    """The profile for an accelerator name as written in `spec.hardware.accelerator`."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in ACCELERATORS and f"nvidia-{key}" in ACCELERATORS:
        key = f"nvidia-{key}"
    if key not in ACCELERATORS:
        raise ValueError(f"unknown accelerator {name!r}; known: {', '.join(sorted(ACCELERATORS))}")
    return ACCELERATORS[key]
