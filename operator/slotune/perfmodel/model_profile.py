"""What a model costs to serve: parameter count, weight bytes by dtype or quantization, KV bytes per token.

A `ModelProfile` is built from a Hugging Face `config.json` (Llama-family field names) or from explicit numbers. The
parameter count follows the Llama layout: attention q/k/v/o, a gated MLP (gate, up, down), two norms per layer,
embeddings (tied or not). Quantization shrinks only the linear layers' weights; embeddings stay in the model dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from slotune.knobs import KVCacheDtype, Quantization

DTYPE_BYTES = {"float32": 4.0, "fp32": 4.0, "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "auto": 2.0}
QUANT_BYTES = {Quantization.INT8: 1.0, Quantization.FP8: 1.0}


@dataclass(frozen=True)
class ModelProfile:
    """Shape of a decoder-only transformer, enough to count its bytes and FLOPs."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPE_BYTES)}")

    @classmethod
    def from_hf_config(cls, config: dict[str, object] | Path | str, name: str | None = None,
                       dtype: str | None = None) -> ModelProfile:
        """From a config.json (path or parsed dict) with Llama field names."""
        if not isinstance(config, dict):
            config = json.loads(Path(config).read_text())
        heads = int(config["num_attention_heads"])  # type: ignore[arg-type]
        hidden = int(config["hidden_size"])  # type: ignore[arg-type]
        return cls(
            name=name or str(config.get("_name_or_path", "model")),
            num_layers=int(config["num_hidden_layers"]),  # type: ignore[arg-type]
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads", heads)),  # type: ignore[arg-type]
            head_dim=int(config.get("head_dim") or hidden // heads),  # type: ignore[arg-type]
            intermediate_size=int(config["intermediate_size"]),  # type: ignore[arg-type]
            vocab_size=int(config["vocab_size"]),  # type: ignore[arg-type]
            dtype=dtype or str(config.get("torch_dtype", "bfloat16")),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @property
    def bytes_per_param(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def linear_params(self) -> int:
        """Weights of the matmuls every token goes through (the 'N' of 2N FLOPs per token, lm_head included)."""
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_dim + 2 * kv_dim) + q_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        lm_head = self.vocab_size * self.hidden_size
        return self.num_layers * (attention + mlp) + lm_head

    @property
    def num_params(self) -> int:
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        embedding = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.linear_params + embedding + norms

    def weight_bytes(self, quantization: Quantization = Quantization.NONE) -> float:
        """Bytes read per forward pass: every linear weight and norm (the input embedding is a gather, not a read)."""
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return self.linear_params * self.weight_width_bytes(quantization) + norms * self.bytes_per_param

    def resident_bytes(self, quantization: Quantization = Quantization.NONE) -> float:
        """Bytes the weights occupy in device memory (the embedding table included)."""
        rest = self.num_params - self.linear_params
        return self.linear_params * self.weight_width_bytes(quantization) + rest * self.bytes_per_param

    def weight_width_bytes(self, quantization: Quantization = Quantization.NONE) -> float:
        return QUANT_BYTES.get(quantization, self.bytes_per_param)

    def kv_bytes_per_token(self, kv_dtype: KVCacheDtype = KVCacheDtype.AUTO) -> float:
        """K and V for every layer: 2 * layers * kv_heads * head_dim * element bytes."""
        element = 1.0 if kv_dtype is KVCacheDtype.FP8 else self.bytes_per_param
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element


# Public configs (Hugging Face config.json of each checkpoint).
LLAMA_3_1_8B = ModelProfile("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_3_1_70B = ModelProfile("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256)
LLAMA_3_2_1B = ModelProfile("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, tie_word_embeddings=True)
QWEN_2_5_14B = ModelProfile("qwen-2.5-14b", 48, 5120, 40, 8, 128, 13824, 152064)
# The test models of docs/facts.md#cpu (tiny fp32 7M, small bf16 125M).
TINY = ModelProfile("tiny", 4, 256, 4, 4, 64, 1024, 8192, dtype="float32", tie_word_embeddings=True)
SMALL = ModelProfile("small", 12, 768, 12, 12, 64, 2048, 50257, dtype="bfloat16", tie_word_embeddings=True)

MODELS = {m.name: m for m in (LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_2_1B, QWEN_2_5_14B, TINY, SMALL)}


def model_profile(name: str) -> ModelProfile:
    if name not in MODELS:
        raise ValueError(f"unknown model profile {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]
