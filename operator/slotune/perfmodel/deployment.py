"""What is being served and on what: a model on an accelerator with tensor parallelism, as the perfmodel sees it.

The diagnosis, the policy and the simulator all price configurations against one `Deployment`. `from_names` maps the
accelerator and model names of a TunedModel spec onto the built-in profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slotune.knobs import RuntimeConfig
from slotune.perfmodel.accelerators import AcceleratorProfile, accelerator
from slotune.perfmodel.model_profile import ModelProfile, model_profile
from slotune.perfmodel.roofline import Efficiency, StepTimeModel


@dataclass(frozen=True)
class Deployment:
    """One replica's hardware and model; knobs come separately as a `RuntimeConfig`."""

    model: ModelProfile
    accelerator: AcceleratorProfile
    tensor_parallel: int = 1
    memory_utilization: float = 0.9
    max_model_len: int = 8192
    efficiency: Efficiency | None = None

    @classmethod
    def from_names(cls, model: str, accelerator_name: str, tensor_parallel: int = 1,
                   max_model_len: int = 8192) -> Deployment:
        return cls(model_profile(model), accelerator(accelerator_name), tensor_parallel, max_model_len=max_model_len)

    def slower(self, factor: float) -> Deployment:
        """This deployment with every step `factor` times as long as profiled (online calibration, `window_step`)."""
        base = self.efficiency or Efficiency.prior(self.accelerator)
        return replace(self, efficiency=base.slower(factor))

    def step_model(self, config: RuntimeConfig) -> StepTimeModel:
        return StepTimeModel(self.model, self.accelerator, self.tensor_parallel, config.quantization,
                             config.kv_cache_dtype, self.efficiency)

    def kv_capacity_tokens(self, config: RuntimeConfig) -> int:
        return self.step_model(config).kv_capacity_tokens(self.memory_utilization, config.max_num_batched_tokens)

    def startup_error(self, config: RuntimeConfig) -> str | None:
        """Why a runtime with this config would fail to start (as vLLM does at its memory profiling), or None."""
        weights_gb = self.model.resident_bytes(config.quantization) / 1e9
        memory_gb = self.accelerator.memory_bytes * self.memory_utilization * self.tensor_parallel / 1e9
        if weights_gb >= memory_gb:
            return f"out of memory: weights need {weights_gb:.1f} GB of {memory_gb:.1f} GB"
        capacity = self.kv_capacity_tokens(config)
        if capacity < self.max_model_len:
            return (f"KV cache holds {capacity} tokens, less than max_model_len {self.max_model_len} "
                    f"(activations for a {config.max_num_batched_tokens}-token step take the rest)")
        return None
