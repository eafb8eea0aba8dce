"""Roofline step time of one engine step (a mix of prefill chunks and decodes) on one replica.

An engine step runs every scheduled token through the model once. Its time is bounded below by
- compute: 2 FLOPs per linear weight per token (Kaplan et al. 2020, "Scaling Laws", C_forward ~ 2N) plus attention,
  4 * layers * (heads * head_dim) FLOPs per token per context position it attends to (PaLM, Chowdhery et al. 2022,
  appendix B: 12*L*H*Q*T for forward+backward, a third of that forward);
- memory: every weight byte once per step, plus the KV cache bytes of every attended context token (docs/facts.md#gpu:
  decode at small batch is memory-bandwidth bound, step >= (weight bytes + KV bytes read) / bandwidth).
The step takes the larger of the two at the achieved efficiency, plus a fixed per-step cost and a per-layer cost (on
CPU eager PyTorch these dominate small models, docs/facts.md#cpu), plus tensor-parallel all-reduces (2 per layer,
ring all-reduce moves 2*(tp-1)/tp of the activations; Megatron-LM, Shoeybi et al. 2019).
Three linear host-side terms, zero unless calibrated (GPU priors keep them at 0), cover what an eager engine pays
outside the roofline, as measured from the builtin runtime's step trace on CPU (bench/results/simulator_validation.md):
a cost per sequence in the step (per-sequence Python bookkeeping, sampling, detokenization, block tables), an extra
cost per prefill chunk (its own attention call per layer and metadata), a cost per new request in its first step (on a
shared CPU the HTTP work of a request arriving, which the server's event loop does under the same interpreter lock as
the engine step), a cost per
context token of a decoding sequence (its KV blocks are gathered into a padded dense tensor and masked every layer,
far slower per token than KV bytes at bandwidth), a cost per attended prefill (query, key) pair (CPU attention
kernels run well below matmul efficiency) and an extra cost per pair whose key is earlier context (a chunk after cached
or computed tokens gathers them from the paged cache and attends with an explicit mask instead of the fused causal
kernel: 1.3x-2.2x the step time the other terms predict for such steps in the step trace).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from slotune.knobs import KVCacheDtype, Quantization
from slotune.perfmodel.accelerators import AcceleratorProfile
from slotune.perfmodel.model_profile import ModelProfile

ALLREDUCE_LATENCY_S = 10e-6  # per all-reduce, NCCL small-message latency on NVLink


@dataclass(frozen=True)
class StepShape:
    """The work of one engine step.

    prefill_attention_tokens is the sum over prefill tokens of the context each attends to (for a chunk of c tokens
    after p cached ones: c * (p + c / 2)); decode_context_tokens is the sum of context lengths of decoding sequences.
    Counts are whole for a real step and fractional for the mean step of a window (`window_step`).
    """

    num_prefill_tokens: float = 0
    prefill_attention_tokens: float = 0.0
    num_decode_seqs: float = 0
    decode_context_tokens: float = 0.0
    tokens_per_decode_seq: float = 1.0  # 1 + drafted tokens verified per step under speculative decoding
    num_prefill_seqs: float = 0  # sequences that bring a prefill chunk (0 with prefill tokens: counted as 1)
    prefill_context_pairs: float = 0.0  # of prefill_attention_tokens, the c * p pairs whose key is earlier context
    num_new_seqs: float = 0  # sequences whose first prefill chunk runs in this step (requests starting)

    @property
    def num_tokens(self) -> float:
        return self.num_prefill_tokens + self.num_decode_seqs * self.tokens_per_decode_seq

    @property
    def num_seqs(self) -> float:
        prefill_seqs = self.num_prefill_seqs or (1 if self.num_prefill_tokens else 0)
        return self.num_decode_seqs + prefill_seqs


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed costs: priors from the accelerator, refit by calibration."""

    bandwidth: float
    compute: float
    step_overhead_s: float
    layer_overhead_s: float
    seq_overhead_s: float = 0.0  # per sequence in the step
    prefill_seq_overhead_s: float = 0.0  # extra per sequence that brings a prefill chunk
    new_seq_overhead_s: float = 0.0  # extra per sequence in its first step
    decode_context_token_s: float = 0.0  # per context token attended by a decoding sequence (per verified token)
    prefill_attention_pair_s: float = 0.0  # per (query, key) pair attended by prefill tokens
    prefill_context_pair_s: float = 0.0  # extra per pair whose key is earlier context (paged, masked path)

    @classmethod
    def prior(cls, accelerator: AcceleratorProfile) -> Efficiency:
        return cls(accelerator.bandwidth_efficiency, accelerator.compute_efficiency, accelerator.step_overhead_s,
                   accelerator.layer_overhead_s, accelerator.seq_overhead_s, accelerator.prefill_seq_overhead_s,
                   accelerator.new_seq_overhead_s, accelerator.decode_context_token_s,
                   accelerator.prefill_attention_pair_s, accelerator.prefill_context_pair_s)

    def slower(self, factor: float) -> Efficiency:
        """Every step `factor` times as long (fractions of peak are capped at 1: a profile measured faster than its
        peak keeps the peak)."""
        seconds = {f.name: getattr(self, f.name) * factor for f in fields(self) if f.name.endswith("_s")}
        return replace(self, bandwidth=min(self.bandwidth / factor, 1.0), compute=min(self.compute / factor, 1.0),
                       **seconds)

    def host_s(self, shape: StepShape) -> float:
        """The linear host-side terms of one step (see the module docstring)."""
        return (self.seq_overhead_s * shape.num_seqs
                + self.prefill_seq_overhead_s * (shape.num_seqs - shape.num_decode_seqs)
                + self.new_seq_overhead_s * shape.num_new_seqs
                + self.decode_context_token_s * shape.decode_context_tokens * shape.tokens_per_decode_seq
                + self.prefill_attention_pair_s * shape.prefill_attention_tokens
                + self.prefill_context_pair_s * shape.prefill_context_pairs)


@dataclass(frozen=True)
class StepCost:
    """The physical work of a step before efficiencies: the terms calibration fits against."""

    memory_s: float  # bytes / peak bandwidth
    compute_s: float  # FLOPs / peak FLOP/s
    comm_s: float


@dataclass(frozen=True)
class StepTimeModel:
    """Step time of one replica of `model` on `tensor_parallel` x `accelerator` with the given weight and KV widths."""

    model: ModelProfile
    accelerator: AcceleratorProfile
    tensor_parallel: int = 1
    quantization: Quantization = Quantization.NONE
    kv_cache_dtype: KVCacheDtype = KVCacheDtype.AUTO
    efficiency: Efficiency | None = None

    @property
    def eff(self) -> Efficiency:
        return self.efficiency or Efficiency.prior(self.accelerator)

    def cost(self, shape: StepShape) -> StepCost:
        m, tp = self.model, self.tensor_parallel
        attn_width = m.num_heads * m.head_dim
        decode_tokens = shape.num_decode_seqs * shape.tokens_per_decode_seq
        attended = shape.prefill_attention_tokens + shape.decode_context_tokens * shape.tokens_per_decode_seq
        flops = 2.0 * m.linear_params * shape.num_tokens + 4.0 * m.num_layers * attn_width * attended
        kv_read = m.kv_bytes_per_token(self.kv_cache_dtype) * (shape.decode_context_tokens + shape.num_prefill_tokens)
        weights = m.weight_bytes(self.quantization)
        peak = self.accelerator.peak_flops_per_s(m.weight_width_bytes(self.quantization))
        comm = 0.0
        if tp > 1:
            activation_bytes = (shape.num_prefill_tokens + decode_tokens) * m.hidden_size * m.bytes_per_param
            per_layer = 2 * (activation_bytes * 2 * (tp - 1) / tp / self.accelerator.interconnect_bytes_per_s
                             + ALLREDUCE_LATENCY_S)
            comm = m.num_layers * per_layer
        return StepCost((weights + kv_read) / tp / self.accelerator.memory_bandwidth_bytes_per_s,
                        flops / tp / peak, comm)

    def fixed_s(self) -> float:
        return self.eff.step_overhead_s + self.eff.layer_overhead_s * self.model.num_layers

    def step_time_s(self, shape: StepShape) -> float:
        cost, eff = self.cost(shape), self.eff
        roofline_s = max(cost.memory_s / eff.bandwidth, cost.compute_s / eff.compute)
        return self.fixed_s() + roofline_s + cost.comm_s + eff.host_s(shape)

    def decode_step_s(self, batch: int, mean_context_tokens: float, tokens_per_seq: float = 1.0) -> float:
        """One decode step for `batch` sequences of the given mean context length."""
        return self.step_time_s(StepShape(num_decode_seqs=batch, decode_context_tokens=batch * mean_context_tokens,
                                          tokens_per_decode_seq=tokens_per_seq))

    def prefill_s(self, prompt_tokens: int, cached_tokens: int = 0, chunk_tokens: int | None = None) -> float:
        """Prefill of one prompt alone, in chunks of chunk_tokens (None: one step), after cached_tokens reused."""
        remaining, done, total = prompt_tokens - cached_tokens, cached_tokens, 0.0
        chunk = chunk_tokens or max(remaining, 1)
        while remaining > 0:
            c = min(chunk, remaining)
            total += self.step_time_s(StepShape(num_prefill_tokens=c, prefill_attention_tokens=c * (done + c / 2),
                                                num_prefill_seqs=1, prefill_context_pairs=c * done,
                                                num_new_seqs=1 if done == cached_tokens else 0))
            remaining, done = remaining - c, done + c
        return total

    def activation_bytes(self, max_num_batched_tokens: int) -> float:
        """Peak activations of the largest step, which vLLM's profiling run reserves: the MLP's gate and up outputs
        plus a few hidden-size buffers per token, in the model dtype."""
        m = self.model
        return max_num_batched_tokens * (2 * m.intermediate_size + 4 * m.hidden_size) * m.bytes_per_param

    def kv_capacity_tokens(self, memory_utilization: float = 0.9, max_num_batched_tokens: int = 2048) -> int:
        """KV cache tokens that fit next to weights and activations (vLLM's --gpu-memory-utilization share)."""
        memory = self.accelerator.memory_bytes * memory_utilization * self.tensor_parallel
        reserved = self.activation_bytes(max_num_batched_tokens) + 0.02 * memory  # + CUDA graphs, allocator slack
        free = memory - self.model.resident_bytes(self.quantization) - reserved
        return max(0, int(free / self.model.kv_bytes_per_token(self.kv_cache_dtype)))
