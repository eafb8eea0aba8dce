"""Opening a GGUF file through the `gguf` package, with typed metadata lookups and one-line errors.

A file that is not GGUF, is truncated or holds an unknown tensor type surfaces from `gguf.GGUFReader` as whatever
numpy or struct raised; `open_gguf` turns all of them into a `ValueError` naming the file, so the command line can
print one line instead of a traceback.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import gguf

GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: Path) -> bool:
    """A regular file that starts with the GGUF magic (the suffix alone could lie)."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: metadata key -> value, and its tensors by name (memory-mapped, not read yet)."""

    path: Path
    reader: gguf.GGUFReader

    @cached_property
    def metadata(self) -> dict[str, object]:
        return {name: field.contents() for name, field in self.reader.fields.items()}

    @cached_property
    def tensors(self) -> dict[str, gguf.ReaderTensor]:
        return {tensor.name: tensor for tensor in self.reader.tensors}

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: object = None) -> object:
        return self.metadata.get(key, default)

    def require(self, key: str) -> object:
        if key not in self.metadata:
            raise ValueError(f"{self.path}: GGUF metadata lacks {key!r}")
        return self.metadata[key]


def open_gguf(path: Path) -> GGUFFile:
    """The parsed file; parsed once per path and version, since config, tokenizer, template and weights all read it
    (parsing SmolLM2's 49k-token vocabulary takes seconds)."""
    path = Path(path)
    if not is_gguf_file(path):
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
    return _open(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open(path: Path, mtime_ns: int) -> GGUFFile:
    try:
        return GGUFFile(path, gguf.GGUFReader(path))
    except (ValueError, KeyError, IndexError, OSError, TypeError) as error:  # truncated or corrupt
        raise ValueError(f"{path} is not a readable GGUF file: {error}") from error
