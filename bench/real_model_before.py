"""The runtime as it was at an earlier commit, in the same process as the current one, so a before/after pair is
measured side by side in one run (alternating within each round, against the same copies): `git archive REV
gpu_runtime` unpacked into a temporary folder as the package `gpu_runtime_before`, its own imports renamed to it.
Both engines load the same GGUF file; the result names the revision."""

from __future__ import annotations

import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
NAME = "gpu_runtime_before"
# The runtime before the C batch-1 kernels (gpu_runtime/model/cpu_kernels.c): every step through PyTorch ops, its
# GEMVs through numpy's OpenBLAS.
BEFORE_REV = "7f56d6b"


ENGINE_MODULE = f"{NAME}.engine.llm_engine"  # LLMEngine, EngineConfig, SchedulerKnobs, SamplingParams


def load(rev: str = BEFORE_REV) -> ModuleType:
    """The engine module at `rev` (LLMEngine, EngineConfig, ... as the current one has them)."""
    if ENGINE_MODULE in sys.modules:
        return sys.modules[ENGINE_MODULE]
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gpu_runtime"], check=True,
                             capture_output=True, timeout=120).stdout
    folder = Path(tempfile.mkdtemp(prefix="runtime-before-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "gpu_runtime").rename(folder / NAME)
    for source in (folder / NAME).rglob("*.py"):
        source.write_text(re.sub(r"\bgpu_runtime\b", NAME, source.read_text()))
    sys.path.insert(0, str(folder))
    return importlib.import_module(ENGINE_MODULE)


def revision(rev: str = BEFORE_REV) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()
