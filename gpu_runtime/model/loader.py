"""Loading checkpoints into LlamaModel: Hugging Face safetensors (single file or sharded with an index) or a GGUF
file, whose tensors model_files hands over under their Hugging Face names.

HF names map onto our fused modules: q/k/v_proj -> self_attn.qkv_proj (concatenated on the output dim in that
order), gate/up_proj -> mlp.gate_up_proj. load_weights copies into existing parameters, so it also reloads weights in
place (the model runner's reload path) without reallocating the KV cache.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpu_runtime.checkpoint.files import checkpoint_tensors, read_model_config
from gpu_runtime.config import ModelConfig
from gpu_runtime.model.cpu_layout import use_decode_layout
from gpu_runtime.model.llama import LlamaModel

_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _shard_sizes(cfg: ModelConfig, fused_name: str) -> list[int]:
    if fused_name == "self_attn.qkv_proj":
        kv = cfg.num_kv_heads * cfg.head_dim
        return [cfg.num_heads * cfg.head_dim, kv, kv]
    return [cfg.intermediate_size, cfg.intermediate_size]


def _target(cfg: ModelConfig, hf_name: str) -> tuple[str, int | None]:
    """(our parameter name, shard index within a fused parameter or None)."""
    for hf_part, (ours, shard) in _FUSED.items():
        if f".{hf_part}." in hf_name:
            return hf_name.replace(hf_part, ours).removeprefix("model."), shard
    return hf_name.removeprefix("model."), None


@torch.inference_mode()
def load_weights(model: LlamaModel, path: Path) -> None:
    """Copy every tensor of the checkpoint (directory or GGUF) into `model`, casting dtype; raises if any parameter
    stays unloaded."""
    cfg = model.config
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for hf_name, tensor in checkpoint_tensors(Path(path), cfg):
        if "rotary_emb" in hf_name:
            continue
        name, shard = _target(cfg, hf_name)
        if name not in params:
            raise ValueError(f"checkpoint tensor {hf_name!r} has no place in the model")
        dest = params[name]
        if shard is not None:
            sizes = _shard_sizes(cfg, name.split(".", 2)[-1].rsplit(".", 1)[0])
            dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
        if dest.shape != tensor.shape:
            raise ValueError(f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, the model "
                             f"{tuple(dest.shape)}")
        dest.copy_(tensor)
        loaded.add(f"{name}#{shard}")
    _tie_or_check(model, params, loaded)
    use_decode_layout(model)  # after tying: the tied head and embedding are one Parameter, converted once


def _tie_or_check(model: LlamaModel, params: dict[str, torch.nn.Parameter], loaded: set[str]) -> None:
    if model.config.tie_word_embeddings and "lm_head.weight#None" not in loaded:
        model.lm_head.weight = model.embed_tokens.weight
        loaded.add("lm_head.weight#None")
    loaded_names = {key.split("#")[0] for key in loaded}
    missing = [
        n for n in params if n not in loaded_names and not (n == "lm_head.weight" and model.config.tie_word_embeddings)
    ]
    if missing:
        raise ValueError(f"checkpoint lacks weights for: {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def load_model(path: Path, dtype: torch.dtype, device: torch.device) -> LlamaModel:
    """Build the model without initialising it (meta device), allocate on `device` in `dtype`, load weights."""
    cfg = read_model_config(Path(path))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to(dtype).to_empty(device=device)  # cast on meta: no fp32 copy is ever allocated
    load_weights(model, Path(path))
    return model.eval()
