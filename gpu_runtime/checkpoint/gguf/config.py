"""A GGUF file's metadata as the runtime's `ModelConfig`, through the Hugging Face config.json field names.

llama.cpp names keys `{architecture}.{key}`; the mapping below follows transformers' GGUF_CONFIG_MAPPING
(integrations/ggml.py), so the shape read here is the one transformers builds from the same file. Llama 3.1/3.2's
rope scaling is stored by llama.cpp's converter as a `rope_freqs` tensor of per-frequency factors (no metadata key),
which this runtime applies as llama.cpp does: each inverse frequency divided by its factor.
"""

from __future__ import annotations

from gpu_runtime.checkpoint.gguf.reader import GGUFFile
from gpu_runtime.checkpoint.gguf.weights import ROPE_FREQS, dequantized
from gpu_runtime.config import ModelConfig

# GGUF architecture -> the Hugging Face architecture this runtime implements for it.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
_REQUIRED = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")
# general.file_type (llama_ftype) -> the dtype "auto" serves in; quantized files dequantize to float32.
_FILE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


def hf_config(file: GGUFFile) -> dict[str, object]:
    """The config.json transformers would derive from this file (the fields the runtime reads)."""
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise ValueError(f"{file.path}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {sorted(ARCHITECTURES)})")
    for key in _REQUIRED:
        file.require(f"{arch}.{key}")
    raw: dict[str, object] = {"architectures": [ARCHITECTURES[arch]], "model_type": arch}
    raw |= {hf: file.get(f"{arch}.{key}") for key, hf in _KEYS.items() if file.get(f"{arch}.{key}") is not None}
    raw.setdefault("vocab_size", len(file.require("tokenizer.ggml.tokens")))  # type: ignore[arg-type]
    raw["tie_word_embeddings"] = "output.weight" not in file.tensors
    raw["bos_token_id"] = file.get("tokenizer.ggml.bos_token_id")
    raw["eos_token_id"] = file.get("tokenizer.ggml.eos_token_id")
    raw["torch_dtype"] = _FILE_DTYPES.get(int(file.get("general.file_type", -1)), "float32")  # type: ignore[arg-type]
    raw["rope_scaling"] = _rope_scaling(file, arch)
    if arch == "qwen2":
        raw["use_sliding_window"] = False
    return raw


def _rope_scaling(file: GGUFFile, arch: str) -> dict[str, object] | None:
    scaling: dict[str, object] = {}
    if ROPE_FREQS in file.tensors:
        scaling["freq_factors"] = dequantized(file.tensors[ROPE_FREQS]).flatten().tolist()
    kind = file.get(f"{arch}.rope.scaling.type")
    if kind not in (None, "none", "linear"):
        raise ValueError(f"{file.path}: rope scaling {kind!r} is not supported; supported: linear")
    if kind == "linear":
        scaling |= {"rope_type": "linear", "factor": float(file.require(f"{arch}.rope.scaling.factor"))}  # type: ignore[arg-type]
    return scaling or None


def model_config(file: GGUFFile) -> ModelConfig:
    return ModelConfig.from_dict(hf_config(file))
