"""Writes GGUF files for tests with `gguf.GGUFWriter`, the way llama.cpp's converter does: from one of the tiny
checkpoints the tests build (q/k rows permuted for llama.cpp's rope, norms kept in F32, the other matrices in the
requested type; the byte-level BPE vocabulary, merges, special tokens and chat template as metadata).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from safetensors.numpy import load_file

_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_FILE_TYPES = {GGMLQuantizationType.F32: 0, GGMLQuantizationType.F16: 1, GGMLQuantizationType.Q4_0: 2,
               GGMLQuantizationType.Q4_1: 3, GGMLQuantizationType.Q8_0: 7, GGMLQuantizationType.BF16: 32}


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: each head's rows (2, D/2) -> (D/2, 2), for interleaved rope."""
    return (weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_name(hf_name: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_NAMES[part]}.{kind}"


def without_rope_scaling(src: Path, dest: Path) -> Path:
    """A copy of a checkpoint with plain rope (write_gguf keeps Llama 3.1 scaling as llama.cpp does, in a tensor)."""
    shutil.copytree(src, dest, dirs_exist_ok=True)
    config = json.loads((dest / "config.json").read_text())
    config.pop("rope_scaling", None)
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def llama3_rope_factors(config: dict[str, object]) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: per frequency, 1 (short wavelengths), `factor`
    (long ones), or the smooth blend between, as float32 `rope_freqs`."""
    scaling = config["rope_scaling"]
    assert isinstance(scaling, dict)
    dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])  # type: ignore[operator]
    freqs = 1.0 / (float(config["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))  # type: ignore[arg-type]
    factor, low = scaling.get("factor", 8.0), scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def add_tensor(writer: GGUFWriter, name: str, values: np.ndarray, qtype: GGMLQuantizationType) -> None:
    """F32 and F16 go in as typed arrays; other types as their packed bytes, whose shape the writer converts."""
    packed = quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)
    plain = qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
    writer.add_tensor(name, packed, raw_dtype=None if plain else qtype)


def _tokenizer_metadata(writer: GGUFWriter, checkpoint: Path) -> None:
    spec = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    vocab |= {t["content"]: t["id"] for t in spec["added_tokens"]}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    cfg = json.loads((checkpoint / "tokenizer_config.json").read_text())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[cfg["bos_token"]])
    writer.add_eos_token_id(vocab[cfg["eos_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(cfg["chat_template"])


def write_gguf(checkpoint: Path, dest: Path, qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
               vocabulary: Callable[[GGUFWriter], None] | None = None) -> Path:
    """A llama GGUF with the checkpoint's weights (matrices in qtype, 1-D tensors in F32) and tokenizer, or the
    tokenizer metadata `vocabulary` writes instead (it must have the checkpoint's vocabulary size)."""
    config = json.loads((checkpoint / "config.json").read_text())
    weights = load_file(str(checkpoint / "model.safetensors"))
    writer = GGUFWriter(dest, "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_file_type(_FILE_TYPES[qtype])
    if vocabulary is None:
        _tokenizer_metadata(writer, checkpoint)
    else:
        vocabulary(writer)
    if (config.get("rope_scaling") or {}).get("rope_type") == "llama3":
        add_tensor(writer, "rope_freqs.weight", llama3_rope_factors(config), GGMLQuantizationType.F32)
    for name, values in weights.items():
        if name.endswith("q_proj.weight"):
            values = llama_cpp_permute(values, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            values = llama_cpp_permute(values, config["num_key_value_heads"])
        add_tensor(writer, gguf_name(name), values, qtype if values.ndim == 2 else GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
