"""Deterministic tiny Hugging Face-style checkpoints for tests, local mode and benchmarks.

`build_checkpoint` writes config.json (LlamaForCausalLM / Qwen2ForCausalLM fields), model.safetensors (optionally
sharded with an index), a real byte-level BPE tokenizer.json trained on text embedded here, and tokenizer_config.json
with a chat template. Same arguments -> byte-identical files, so tests and local mode never download weights.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_COMPLETE_MARKER = ".complete"
_ARCHS = ("llama", "qwen2")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Preset:
    """Model shape of one preset; vocab_size is also the trained tokenizer's exact size."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int


PRESETS: dict[str, Preset] = {
    "nano": Preset(64, 2, 4, 2, 128, 512, 1024),
    "tiny": Preset(256, 4, 8, 4, 704, 2048, 2048),
    "small": Preset(768, 12, 12, 4, 2304, 8192, 4096),
}

_SEED_TEXT = """\
The quick brown fox jumps over the lazy dog. A serving runtime turns requests into tokens, one step at a time.
Every step schedules running sequences first, then admits waiting ones while the token budget lasts.
Latency is measured from arrival to the first token, and between tokens after that; the tail matters most.
Prefix caching reuses the key and value blocks of prompts that share a beginning, so the first token comes sooner.
Speculative decoding drafts a few tokens cheaply and verifies them in one forward pass of the large model.
Quantization stores weights in fewer bits, which helps when decoding is bound by memory bandwidth.
Once upon a time there was a small model that wanted to write stories about rivers, mountains and old cities.
It learned numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 and dates like 2024-05-17.
def hello(name):\n    return f"Hello, {name}!"\nprint(hello("world"))
Questions and answers: What is the capital of France? Paris. How many legs does a spider have? Eight.
"""
_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "ta",
    "shi",
    "po",
    "ve",
    "da",
    "lin",
    "mor",
    "tes",
    "an",
    "el",
    "or",
    "un",
    "ix",
    "qua",
    "zer",
    "bo",
    "fi",
    "gu",
    "ha",
    "je",
    "ko",
    "lu",
    "ma",
    "no",
    "pe",
    "ri",
    "sa",
    "to",
    "vu",
    "wa",
    "ye",
    "zo",
    "ber",
    "cal",
    "den",
    "fos",
    "gar",
    "hil",
    "jor",
    "kem",
    "lus",
    "mar",
    "nix",
]


def _corpus(num_words: int) -> list[str]:
    """The embedded text plus deterministic syllable words, enough distinct pairs to reach the largest vocab."""
    rng = random.Random(1234)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(num_words)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    return [_SEED_TEXT] * 20 + lines


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer with exactly `vocab_size` entries (padded with reserved special tokens)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(num_words=max(4000, vocab_size * 4)), trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    return tok


def _config_dict(preset: Preset, arch: str, dtype: str, bos_id: int, eos_id: int) -> dict[str, object]:
    cfg: dict[str, object] = {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_layers,
        "num_attention_heads": preset.num_heads,
        "num_key_value_heads": preset.num_kv_heads,
        "head_dim": preset.hidden_size // preset.num_heads,
        "vocab_size": preset.vocab_size,
        "max_position_embeddings": preset.max_position_embeddings,
        "rms_norm_eps": 1e-5 if arch == "llama" else 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    if arch == "llama":
        # Llama 3.1's rope scaling (meta-llama/Llama-3.1-8B config.json), so the loader's llama3 path is exercised.
        cfg["rope_theta"] = 500000.0
        cfg["attention_bias"] = False
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        }
    else:
        cfg["rope_theta"] = 1000000.0
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = preset.num_layers
    return cfg


def _random_weights(preset: Preset, arch: str, seed: int) -> dict[str, torch.Tensor]:
    """Random weights scaled so that greedy decoding stays varied.

    Projections use std 1/sqrt(fan_in) (LeCun init) and embeddings std 0.5: with HF's flat std 0.02 a random model
    either echoes the last token or repeats one token forever. Norm weights are jittered around 1 so a mis-loaded
    norm shows in the logits.
    """
    gen = torch.Generator().manual_seed(seed)
    h, kv_dim = preset.hidden_size, preset.num_kv_heads * (preset.hidden_size // preset.num_heads)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    def linear(out_dim: int, in_dim: int) -> torch.Tensor:
        return normal(out_dim, in_dim, std=in_dim**-0.5)

    def norm(dim: int) -> torch.Tensor:
        return 1.0 + normal(dim, std=0.1)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(preset.vocab_size, h, std=0.5)}
    for i in range(preset.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        for name, out_dim in (("q_proj", h), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            w[p + f"self_attn.{name}.weight"] = linear(out_dim, h)
            if arch == "qwen2":
                w[p + f"self_attn.{name}.bias"] = normal(out_dim, std=0.1)
        w[p + "self_attn.o_proj.weight"] = linear(h, h)
        w[p + "mlp.gate_proj.weight"] = linear(preset.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = linear(preset.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = linear(h, preset.intermediate_size)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = normal(preset.vocab_size, h, std=0.05)
    return w


def _save_weights(path: Path, weights: dict[str, torch.Tensor], num_shards: int) -> None:
    if num_shards <= 1:
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(weights)
    weight_map: dict[str, str] = {}
    total_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    for shard in range(num_shards):
        file_name = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: weights[n] for n in names[shard::num_shards]}
        weight_map.update({n: file_name for n in part})
        save_file(part, str(path / file_name), metadata={"format": "pt"})
    index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _tokenizer_config(max_len: int) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "add_bos_token": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }


def build_checkpoint(
    path: Path,
    preset: str = "tiny",
    arch: str = "llama",
    seed: int = 0,
    dtype: str = "float32",
    num_shards: int = 1,
) -> Path:
    """Write a deterministic checkpoint into `path` (skipped when already complete) and return `path`.

    num_shards > 1 writes model-0000k-of-0000n.safetensors plus model.safetensors.index.json, like large HF models.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if arch not in _ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {_ARCHS}")
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
    path = Path(path)
    if (path / _COMPLETE_MARKER).exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    spec = PRESETS[preset]
    tok = build_tokenizer(spec.vocab_size)
    tok.save(str(path / "tokenizer.json"))
    bos_id, eos_id = tok.token_to_id(BOS_TOKEN), tok.token_to_id(EOS_TOKEN)
    config = _config_dict(spec, arch, dtype, bos_id, eos_id)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok_cfg = _tokenizer_config(spec.max_position_embeddings)
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    weights = {n: t.to(_DTYPES[dtype]).contiguous() for n, t in _random_weights(spec, arch, seed).items()}
    _save_weights(path, weights, num_shards)
    (path / _COMPLETE_MARKER).write_text("ok\n")
    return path
