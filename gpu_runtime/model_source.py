"""Where a `--model` argument points: a checkpoint directory, or `builtin://PRESET`, a deterministic checkpoint
the runtime generates on first use and caches (no weights can be downloaded on the machines slotune is tested on, and
a newcomer's first run must not need any)."""

from __future__ import annotations

import os
from pathlib import Path

BUILTIN_SCHEME = "builtin://"


def model_cache_dir() -> Path:
    return Path(os.environ.get("SLOTUNE_MODEL_CACHE", Path.home() / ".cache" / "slotune" / "models"))


def resolve_model(source: str) -> str:
    """A local checkpoint directory for `source`, building builtin presets on first use."""
    if source.startswith(BUILTIN_SCHEME):
        from gpu_runtime.checkpoint import build_checkpoint

        preset = source.removeprefix(BUILTIN_SCHEME)
        return str(build_checkpoint(model_cache_dir() / preset, preset=preset))
    if source.startswith("file://"):
        source = source.removeprefix("file://")
    if not Path(source).is_dir():
        raise ValueError(f"--model {source!r} is not a checkpoint directory (or builtin://PRESET)")
    return source
