"""build_checkpoint: deterministic files, a real tokenizer, shapes per preset, loadable by transformers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpu_runtime.checkpoint.builtin import PRESETS, build_checkpoint
from gpu_runtime.config import ModelConfig
from gpu_runtime.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer


def _digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_same_arguments_give_byte_identical_files(tmp_path: Path) -> None:
    a = build_checkpoint(tmp_path / "a", preset="nano", arch="qwen2", seed=3, num_shards=2)
    b = build_checkpoint(tmp_path / "b", preset="nano", arch="qwen2", seed=3, num_shards=2)
    assert _digests(a) == _digests(b)
    c = build_checkpoint(tmp_path / "c", preset="nano", arch="qwen2", seed=4, num_shards=2)
    assert _digests(a) != _digests(c)
    assert (a / "model.safetensors.index.json").exists()


def test_rebuild_is_skipped_when_complete(tmp_path: Path) -> None:
    path = build_checkpoint(tmp_path / "n", preset="nano")
    before = (path / "model.safetensors").stat().st_mtime_ns
    build_checkpoint(path, preset="nano")
    assert (path / "model.safetensors").stat().st_mtime_ns == before


def test_config_tokenizer_and_chat_template(nano_llama: Path) -> None:
    cfg = ModelConfig.from_dir(nano_llama)
    preset = PRESETS["nano"]
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_kv_heads) == (preset.hidden_size, preset.num_layers, 2)
    assert cfg.rope_scaling.rope_type == "llama3"
    tok = Tokenizer(nano_llama, cfg.eos_token_ids)
    assert tok.vocab_size == cfg.vocab_size
    text = "Hello, world! Once upon a time."
    assert tok.decode(tok.encode(text)) == text
    assert tok.eos_token_id in cfg.eos_token_ids and tok.chat_template and "messages" in tok.chat_template
    tok_cfg = json.loads((nano_llama / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|end_of_text|>"


@pytest.mark.parametrize(("preset", "arch"), [("nano", "bad"), ("huge", "llama")])
def test_bad_arguments_are_refused(tmp_path: Path, preset: str, arch: str) -> None:
    with pytest.raises(ValueError):
        build_checkpoint(tmp_path / "x", preset=preset, arch=arch)


def test_small_preset_is_about_100m_parameters() -> None:
    p = PRESETS["small"]
    cfg = ModelConfig.from_dict(
        {
            "hidden_size": p.hidden_size,
            "intermediate_size": p.intermediate_size,
            "num_hidden_layers": p.num_layers,
            "num_attention_heads": p.num_heads,
            "num_key_value_heads": p.num_kv_heads,
            "vocab_size": p.vocab_size,
        }
    )
    assert 80e6 < cfg.num_params < 130e6


def test_incremental_detokenizer_never_splits_characters(nano_llama: Path) -> None:
    tok = Tokenizer(nano_llama)
    text = "héllo wörld, 世界 ✓ done"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.step(ids[: i + 1]) for i in range(len(ids))]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({"use_sliding_window": True, "sliding_window": 64}, "sliding-window"),
    ],
)
def test_unsupported_configs_are_refused(nano_llama: Path, override: dict[str, object], message: str) -> None:
    raw = json.loads((nano_llama / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**raw, **override})
