"""Typed, frozen configuration of the runtime: model shape (parsed from config.json), sampling parameters,
scheduler knobs and engine settings. Pure Python (no torch) so the scheduler and block manager can use it.

The tunable knobs' bounds and choices are not written here: they come from `gpu_runtime/knob_schema.py`, which
`slotune crd --write` generates from the operator's single knob declaration (operator/slotune/knobs/schema.py), so
the flags, `/admin/config` and the operator's API bound every knob alike without sharing a Python import.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from gpu_runtime import knob_schema
from gpu_runtime.speculative.config import SpeculativeSettings

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
MAX_MODEL_LEN_CAP = 32768
DEFAULT_CPU_KV_CACHE_BYTES = 256 * 1024 * 1024
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class KnobLimits:
    """One row of the generated knob schema: what values a knob takes and whether /admin/config changes it live."""

    name: str
    kind: str  # int, bool, choice or json
    flag: str | None
    hot: bool
    default: int | bool | str | None
    minimum: int | None
    maximum: int | None
    choices: tuple[str, ...]

    def check(self, value: int | str) -> None:
        """Raise ValueError, naming the knob and its bounds, when `value` is out of them."""
        low, high = self.minimum, self.maximum
        if isinstance(value, int) and low is not None and high is not None and not low <= value <= high:
            raise ValueError(f"{self.name} must be in [{self.minimum}, {self.maximum}], got {value}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")


KNOBS: dict[str, KnobLimits] = {row["name"]: KnobLimits(**row) for row in knob_schema.KNOBS}  # type: ignore[arg-type, misc]
SPECULATIVE_TOKENS: tuple[int, int] = knob_schema.SPECULATIVE_TOKENS
PROMPT_LOOKUP: tuple[int, int] = knob_schema.PROMPT_LOOKUP
QUANTIZATIONS = KNOBS["quantization"].choices  # gpu_runtime.quant.QuantScheme, named here without importing torch
KV_CACHE_DTYPES = KNOBS["kv_cache_dtype"].choices


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling; rope_type "default" means none. Fields follow HF's rope_scaling dict."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # llama.cpp's rope_freqs tensor (how GGUF files store Llama 3.1 scaling): each inverse frequency is divided by its
    # factor, on top of rope_type. Not an HF field; only GGUF files set it.
    freq_factors: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape, read from a Hugging Face config.json."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    attention_bias: bool
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @property
    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * self.num_heads * self.head_dim * 2 + 2 * h * kv
        mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp) + embed

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        raw = json.loads((Path(path) / "config.json").read_text())
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> ModelConfig:
        arch = _architecture(raw)
        heads = int(raw["num_attention_heads"])  # type: ignore[arg-type]
        hidden = int(raw["hidden_size"])  # type: ignore[arg-type]
        eos = raw.get("eos_token_id")
        eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))  # type: ignore[arg-type]
        theta, scaling = _rope(raw)
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),  # type: ignore[arg-type]
            num_layers=int(raw["num_hidden_layers"]),  # type: ignore[arg-type]
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),  # type: ignore[arg-type]
            head_dim=int(raw.get("head_dim") or hidden // heads),  # type: ignore[arg-type]
            vocab_size=int(raw["vocab_size"]),  # type: ignore[arg-type]
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),  # type: ignore[arg-type]
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),  # type: ignore[arg-type]
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=None if raw.get("bos_token_id") is None else int(raw["bos_token_id"]),  # type: ignore[arg-type]
            eos_token_ids=eos_ids,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )


def _architecture(raw: dict[str, object]) -> str:
    archs = raw.get("architectures") or ["LlamaForCausalLM"]
    arch = str(archs[0])  # type: ignore[index]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHITECTURES}")
    window = raw.get("sliding_window")
    uses_window = raw.get("use_sliding_window", arch == "MistralForCausalLM") and window is not None
    if uses_window and int(window) < int(raw.get("max_position_embeddings", 0)):  # type: ignore[call-overload]
        raise ValueError(f"sliding-window attention (window {window}) is not supported")
    return arch


def _rope(raw: dict[str, object]) -> tuple[float, RopeScaling]:
    """Accept both the classic (rope_theta + rope_scaling) and transformers v5 (rope_parameters) layouts."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    assert isinstance(params, dict)
    theta = float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, linear, llama3")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        freq_factors=tuple(float(f) for f in params.get("freq_factors", ())),  # type: ignore[union-attr]
    )
    return theta, scaling


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters. temperature 0 means greedy; top_k 0 means off."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; N >= 0: each new token's logprob under the model's raw logits plus the N most likely (vLLM).
    logprobs: int | None = None
    # vLLM: no stop (EOS, stop_token_ids, stop strings) before this many output tokens.
    min_tokens: int = 0
    # OpenAI: (token id, bias in [-100, 100]) pairs added to the logits before sampling.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}")
        if any(not -100.0 <= bias <= 100.0 for _, bias in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")
        # Callers (the server) may pass lists; normalise so the dataclass stays hashable and immutable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SchedulerKnobs:
    """The live-tunable batching knobs (vLLM flag names without dashes)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        KNOBS["max_num_seqs"].check(self.max_num_seqs)
        KNOBS["max_num_batched_tokens"].check(self.max_num_batched_tokens)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs at start; knobs can change later through LLMEngine.reconfigure."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    knobs: SchedulerKnobs = field(default_factory=SchedulerKnobs)
    seed: int = 0
    speculative: SpeculativeSettings | None = None  # --speculative-config; None is off
    quantization: str = "none"  # --quantization: none | int8 | fp8 (weights quantized from the checkpoint at load)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        KNOBS["quantization"].check(self.quantization)
