"""Checkpoints derived from a target for speculative decoding: a layer-truncated self-draft and a successor model.

`build_truncated_draft` keeps the target's first layers, embedding, final norm and head (the early-exit draft of
LayerSkip, Elhoushi et al. 2024, and Draft & Verify, Zhang et al. 2024): a smaller model with exactly the target's
tokenizer, which is what a draft needs; tests and benchmarks build it from the tiny checkpoints.

`build_successor_model` turns a checkpoint into one whose greedy next token is a fixed function of the current token
(attention and MLP outputs zeroed, head rows set to the embedding of each token's predecessor). Random tiny models
never repeat their prompt, so this is how tests and benchmarks get a real model whose continuation repeats the
prompt, the summarization-like regime where prompt lookup pays off. Same shapes, hence the same cost per step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gpu_runtime.checkpoint.files import safetensors_files

_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
    "generation_config.json",
)


def _load_all(path: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        weights.update(load_file(str(file)))
    return weights


def _write(src: Path, dest: Path, config: dict[str, object], weights: dict[str, torch.Tensor]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, dest / name)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.contiguous() for k, v in weights.items()}
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def build_truncated_draft(target: Path, dest: Path, num_layers: int) -> Path:
    """A draft made of the target's first num_layers decoder layers (plus embedding, final norm and head)."""
    target, dest = Path(target), Path(dest)
    config = json.loads((target / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers must be in 1..{config['num_hidden_layers']}, got {num_layers}")
    config["num_hidden_layers"] = num_layers
    kept = {
        name: tensor for name, tensor in _load_all(target).items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
    }
    return _write(target, dest, config, kept)


def build_successor_model(target: Path, dest: Path, successor: torch.Tensor, logit_scale: float = 4.0) -> Path:
    """A model whose greedy next token after token t is successor[t] (successor: a permutation of the vocab).

    With every layer's output projections zero the final hidden state is rmsnorm(embed[t]); head row v is
    logit_scale * embed[u] with successor[u] = v, so logit v peaks at u = t: random embedding rows are nearly
    orthogonal, so the margin over every other token is large.
    """
    target, dest = Path(target), Path(dest)
    config = json.loads((target / "config.json").read_text())
    weights = _load_all(target)
    embed = weights["model.embed_tokens.weight"]  # [V, H]
    if sorted(successor.tolist()) != list(range(embed.shape[0])):
        raise ValueError("successor must be a permutation of the vocabulary")
    for name in weights:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = torch.zeros_like(weights[name])
    predecessor = torch.empty_like(successor)
    predecessor[successor] = torch.arange(successor.numel())
    head = embed[predecessor] / embed[predecessor].norm(dim=1, keepdim=True) * logit_scale * embed.shape[1] ** 0.5
    weights["lm_head.weight"] = head.to(embed.dtype)
    config["tie_word_embeddings"] = False
    return _write(target, dest, config, weights)


def cycle_successor(vocab_size: int, cycle: list[int]) -> torch.Tensor:
    """The permutation that walks `cycle` (last -> first) and maps every other token to itself."""
    successor = torch.arange(vocab_size)
    for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        successor[a] = b
    return successor
