"""The served model's shape for local mode's performance model, read from the files the runtime will read.

A source is a checkpoint directory (its config.json), a builtin preset (built by the runtime into its model cache),
a GGUF file, or pkg://PACKAGE/FILE (a file inside an installed Python package, found without importing the package,
the way the runtime resolves it). A GGUF file's metadata is mapped onto config.json's field names with the `gguf`
package, which local mode has because it runs the runtime on this machine.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

BUILTIN = "builtin://"
PACKAGE = "pkg://"
# llama.cpp metadata key (after "ARCH.") -> config.json field.
_GGUF_FIELDS = {
    "embedding_length": "hidden_size", "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim", "vocab_size": "vocab_size",
}


def local_path(source: str) -> Path:
    """The directory or file the runtime reads for `source`."""
    if source.startswith(BUILTIN):
        cache = Path(os.environ.get("SLOTUNE_MODEL_CACHE", Path.home() / ".cache" / "slotune" / "models"))
        return cache / source.removeprefix(BUILTIN)
    if source.startswith(PACKAGE):
        package, _, resource = source.removeprefix(PACKAGE).partition("/")
        spec = importlib.util.find_spec(package) if package.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{source}: no installed package {package!r}")
        return Path(next(iter(spec.submodule_search_locations))) / resource
    return Path(source.removeprefix("file://"))


def gguf_config(path: Path) -> dict[str, object]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.")}
    arch = fields["general.architecture"]
    config: dict[str, object] = {hf: fields[f"{arch}.{key}"] for key, hf in _GGUF_FIELDS.items()
                                 if f"{arch}.{key}" in fields}
    if "vocab_size" not in config:
        config["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    config["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    config["torch_dtype"] = {1: "float16", 32: "bfloat16"}.get(int(fields.get("general.file_type", 0)), "float32")
    return config


def model_config(source: str) -> dict[str, object] | Path:
    """config.json's path for a checkpoint directory, or the equivalent fields of a GGUF file."""
    path = local_path(source)
    return path / "config.json" if path.is_dir() or source.startswith(BUILTIN) else gguf_config(path)
