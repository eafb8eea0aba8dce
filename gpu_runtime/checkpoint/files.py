"""What a resolved model path holds: a Hugging Face checkpoint directory (config.json, safetensors, tokenizer files)
or one GGUF file. Everything that reads a model (engine, loader, tokenizer, draft models) asks here, so the two
formats differ in one place, and a path that is neither gets one `ValueError` that says what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from gpu_runtime.config import ModelConfig


def is_gguf(path: Path) -> bool:
    from gpu_runtime.checkpoint.gguf.reader import is_gguf_file

    return is_gguf_file(Path(path))


def check_model_path(path: Path) -> None:
    """Raise ValueError (one line) unless `path` is a checkpoint directory with config.json or a GGUF file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model path {path} does not exist")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {path} has no config.json (not a Hugging Face checkpoint)")
        return
    if not is_gguf(path):
        raise ValueError(f"model file {path} is not a GGUF file (expected a checkpoint directory or a .gguf file)")


def read_model_config(path: Path) -> ModelConfig:
    """The model's shape, from config.json or from the GGUF metadata."""
    path = Path(path)
    check_model_path(path)
    if path.is_dir():
        try:
            return ModelConfig.from_dir(path)
        except (KeyError, TypeError) as error:  # a field missing or of the wrong type
            raise ValueError(f"{path / 'config.json'} is not a usable model config: missing or bad {error}") from error
    from gpu_runtime.checkpoint.gguf.config import model_config
    from gpu_runtime.checkpoint.gguf.reader import open_gguf

    return model_config(open_gguf(path))


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, following model.safetensors.index.json when present."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise ValueError(f"model directory {path} has no safetensors weights")
    return found


def checkpoint_tensors(path: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face tensor name, tensor) for every weight of the model, one at a time."""
    path = Path(path)
    if path.is_dir():
        for file in safetensors_files(path):
            try:
                with safe_open(str(file), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                        yield name, f.get_tensor(name)
            except SafetensorError as error:  # truncated or not safetensors at all
                raise ValueError(f"{file} is not a readable safetensors file: {error}") from error
        return
    from gpu_runtime.checkpoint.gguf.reader import open_gguf
    from gpu_runtime.checkpoint.gguf.weights import hf_tensors

    yield from hf_tensors(open_gguf(path), cfg.num_heads, cfg.num_kv_heads)
