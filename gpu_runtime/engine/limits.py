"""What the engine can hold, settled once at start: the device and dtype it runs in, the longest sequence it accepts,
how many KV blocks fit its memory budget, and the checks a request must pass against those limits before it is
queued (a request that can never run is refused at the door, not left waiting)."""

from __future__ import annotations

import torch

from gpu_runtime.config import DEFAULT_CPU_KV_CACHE_BYTES, MAX_MODEL_LEN_CAP, EngineConfig, ModelConfig, SamplingParams
from gpu_runtime.engine.block_manager import BlockManager
from gpu_runtime.engine.model_runner import kv_bytes_per_block

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CUDA_ACTIVATION_RESERVE_BYTES = 1 << 30


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, model_cfg: ModelConfig, device: torch.device) -> torch.dtype:
    dtype = _DTYPES.get(model_cfg.torch_dtype, torch.float32) if name == "auto" else _DTYPES[name]
    if name == "auto" and device.type == "cpu" and dtype == torch.float16:
        return torch.float32  # fp16 matmuls on CPU are slow and not more accurate than fp32
    return dtype


def max_model_len(config: EngineConfig, model_cfg: ModelConfig) -> int:
    limit = min(model_cfg.max_position_embeddings, MAX_MODEL_LEN_CAP)
    wanted = config.max_model_len or limit
    if wanted > model_cfg.max_position_embeddings:
        raise ValueError(
            f"max_model_len {wanted} exceeds the model's max_position_embeddings "
            f"{model_cfg.max_position_embeddings}"
        )
    return wanted


def num_kv_blocks(config: EngineConfig, model_cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Blocks the KV budget holds: on CUDA what the weights left of gpu_memory_utilization, on CPU a byte budget."""
    per_block = kv_bytes_per_block(model_cfg, config.block_size, dtype)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(free - total * (1 - config.gpu_memory_utilization)) - _CUDA_ACTIVATION_RESERVE_BYTES
    else:
        budget = config.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(f"KV cache budget of {budget} bytes holds no block of {per_block} bytes")
    return num_blocks


def check_request(prompt: list[int], params: SamplingParams, model_cfg: ModelConfig, max_len: int,
                  block_manager: BlockManager) -> None:
    """Raise ValueError when the request can never run: empty, too long, token ids out of the vocabulary, or more
    KV blocks than the whole cache holds."""
    if not prompt:
        raise ValueError("prompt must contain at least one token")
    if len(prompt) + params.max_tokens > max_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
            f"max_model_len ({max_len})"
        )
    if min(prompt) < 0 or max(prompt) >= model_cfg.vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {model_cfg.vocab_size})")
    if any(not 0 <= token < model_cfg.vocab_size for token, _ in params.logit_bias):
        raise ValueError(f"logit_bias token ids must be in [0, {model_cfg.vocab_size})")
    if block_manager.blocks_needed(len(prompt) + params.max_tokens) > block_manager.num_total_blocks:
        raise ValueError(
            f"prompt + max_tokens needs more KV blocks than the whole cache holds "
            f"({block_manager.num_total_blocks} blocks of {block_manager.block_size} tokens)"
        )
