"""Local mode reads the served model's shape from the file the runtime serves: config.json, or a GGUF's metadata,
also when the source is pkg://PACKAGE/FILE."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from slotune.local.model_config import local_path, model_config
from slotune.perfmodel.model_profile import ModelProfile

gguf = pytest.importorskip("gguf")


def _write_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(1)
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_metadata_becomes_the_profile(tmp_path: Path) -> None:
    profile = ModelProfile.from_hf_config(model_config(str(_write_gguf(tmp_path / "m.gguf"))), name="m")
    assert (profile.num_layers, profile.hidden_size, profile.num_heads, profile.num_kv_heads) == (2, 64, 4, 2)
    assert (profile.intermediate_size, profile.vocab_size, profile.head_dim) == (128, 3, 16)
    assert profile.tie_word_embeddings and profile.dtype == "float16"


def test_pkg_source_is_found_without_importing_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "weights_pkg_x"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('heavy dependency missing')\n")
    _write_gguf(package / "m.gguf")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert local_path("pkg://weights_pkg_x/m.gguf") == package / "m.gguf"
    assert model_config("pkg://weights_pkg_x/m.gguf")["num_hidden_layers"] == 2
    assert "weights_pkg_x" not in sys.modules
    with pytest.raises(ValueError, match="no installed package"):
        local_path("pkg://no_such_pkg_x/m.gguf")


def test_checkpoint_directories_keep_their_config_json(tmp_path: Path) -> None:
    assert model_config(str(tmp_path)) == tmp_path / "config.json"
    assert model_config(f"file://{tmp_path}") == tmp_path / "config.json"
